"""Mixture-of-experts routing: capture the old policy's experts, replay them, measure drift.

Why this exists (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071,
sec. 5.3 "Benefit of GSPO for MoE training"): in an MoE policy the experts a token is routed to
can change between pi_old and pi_theta, so GRPO's token ratio pi_theta(y_t) / pi_old(y_t) is taken
between two different sub-networks. The paper's GRPO baseline needs *routing replay* - cache the
experts pi_old activated and reuse them in pi_theta's forward - while GSPO's sequence ratio does
not. This package supplies that option and the diagnostics that show the effect.

Routing replay comes in two flavours (`ArmConfig.routing_replay`):
- `old` (R2-style): replay the experts of the learner's own start-of-step forward, so pi_theta
  and pi_old share a sub-network; the behaviour policy (the generator) may still have routed
  differently.
- `rollout` (R3, Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning Training and
  Inference Routers", arXiv:2510.11370): replay the experts the *generator* routed each token to
  (recorded by the torch generator, carried by schema-v2 rollout records, collated into
  `RolloutBatch.routed_experts`) in the pi_old forward and in every minibatch forward, so the
  learner's log-probs are taken on the sampler's sub-network and the training-inference routing
  mismatch is removed; the gates stay differentiable through the learner's router.

The step sees only the `Routing` protocol (`base`: capture pi_old's routes, replay them, the
step's `moe/*` metrics), chosen once per learner by `setup.setup_routing`: `base.NoRouting`
for a dense policy, `routing.MoeRouting` for an MoE one. The rest serves `MoeRouting`:
- `hooks`: forward hooks on the router modules, which routers are supported. `capture_routing`
  records each router's top-k expert indices during a forward (one byte each up to 256
  experts, `index_dtype`) and of its logits only each token's router entropy, reduced in the
  hook (at the GSPO paper's scale, Qwen3-30B-A3B, 48 layers x 128 experts, the float32 logits
  were 24 KiB a token); `replay_experts` makes a forward use given top-k indices, with the
  gates still computed by the current router, exactly as it computes them for its own choice.
  The torch generator records its rollouts' experts with the same capture (`learner.scoring`);
- `record`: pi_old's routing of the step batch, captured micro-batch by micro-batch
  (`learner.micro_batch_tokens`) and kept in host memory (k + 4 bytes a token a sparse layer
  up to 256 experts), so a routing pass holds one micro-batch's activations and capture on the
  device, as a dense pass holds its activations;
- `metrics` and `tally`: the `moe/*` metrics, pure functions of the captured tensors, counted
  part by part against the matching slice of that record, so no second record is ever made;
- `logratio`: what the re-routing does to the token ratio: the metric pass scores each part
  with the routers free and with pi_old's experts replayed, and the variance of the difference
  is routing's share.
"""
