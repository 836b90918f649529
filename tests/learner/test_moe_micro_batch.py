"""An MoE policy's routing passes in micro-batches (`learner.micro_batch_tokens`).

pi_old's pass (`step._score`, its routing captured or, under `routing_replay: rollout`, replayed
per part by `StepRouting.capture_old`) and the `moe/*` routing pass after the updates run in the
step's micro-batches. Pinned here, on the tiny Qwen3-MoE of test_moe.py:

- the router entropy streamed from the hook gives today's logits-based `moe/router_entropy`
  bit for bit (the capture keeps no router logits);
- the routing captured part by part is the whole batch's *exactly* at every real position, so
  the `moe/*` metrics that count experts are the whole batch's exactly, and pi_old's log-probs,
  entropies and the router entropy are the whole batch's up to float rounding (bounded by the
  computation: tests/learner/float_bounds.py);
- two steps with a budget compute the gradients, weights, gradient norms and metrics (every
  `moe/*` one included) of the same steps without it, update by update, up to float rounding
  bounded as in test_step_micro_batch.py (tests/learner/lockstep.py), for GSPO, GRPO and GRPO
  with either routing replay.

Without a budget the step is unchanged bit for bit (one part at the batch's width: the capture is
the whole forward's, as before); the learner-step tests of test_moe.py run that path.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from transformers import AutoConfig

from buffer.collate import RolloutBatch
from contract import metrics as M
from learner.algorithms.sampling_dist import PLAIN
from learner.config import LearnerConfig, make_arm
from learner.runtime.models import build_step_models
from learner.runtime.moe.hooks import capture_routing, router_entropy, router_modules
from learner.runtime.moe.metrics import (
    masked_mean_per_layer,
    predicting_positions,
    router_entropy_per_layer,
)
from learner.runtime.moe.routing import MoeRouting, StepRouting
from learner.runtime.moe.tally import routing_metrics
from learner.runtime.step import _score, train_on_batch
from learner.runtime.update import micro_batches
from tests.learner.float_bounds import TERM_SCALE, backward_chain, forward_chain, reorder_tol
from tests.learner.lockstep import Update, check_lockstep, check_step_metrics, recording
from tests.learner.test_moe import GROUP_SIZE, moe_batch_routed_by_another, tiny_moe

# moe_batch: 16 rows of 3-9 real tokens; 8 padded tokens per part puts 1-2 rows in each.
BUDGET = 8
LR = 5e-4  # as test_step_micro_batch.py: 8 AdamW updates move weights by up to 4e-3
PROMPTS, MINIBATCHES = 4, 2
ARMS = {
    "gspo": {"objective": "gspo"},
    "grpo": {"objective": "grpo"},
    "grpo_replay_old": {"objective": "grpo", "routing_replay": "old"},
    "grpo_replay_rollout": {"objective": "grpo", "routing_replay": "rollout"},
}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("moe_micro")
    tiny_moe().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def batch() -> RolloutBatch:
    return moe_batch_routed_by_another()


def step_parts(batch: RolloutBatch, budget: int | None) -> list:
    """The micro-batches of the step's no-grad passes (`step._score`'s `every_row`)."""
    rows = torch.arange(batch.batch_size)[None, :]  # (1, B)
    return micro_batches(rows, 0, batch.attention_mask.sum(-1), budget)


def test_the_budget_splits_the_batch_into_several_parts(batch: RolloutBatch) -> None:
    parts = step_parts(batch, BUDGET)
    assert len(parts) >= 3
    widths = [part.width for part in parts]  # some narrower than the batch: padding left out
    assert None not in widths and min(widths) < batch.input_ids.shape[1], widths


def test_streamed_router_entropy_is_todays_logits_based_metric_bit_for_bit(
    batch: RolloutBatch,
) -> None:
    """Today's `moe/router_entropy` kept each router's float32 logits and reduced them after the
    forward; the capture now reduces them in the hook. Same capture, same numbers, bitwise."""
    model = tiny_moe()
    logits: list[torch.Tensor] = []  # each router's (N, E) logits, as the old recorder kept them
    handles = [
        router.register_forward_hook(lambda _m, _a, out: logits.append(out[0].detach().float()))
        for router in router_modules(model)
    ]
    try:
        with torch.no_grad(), capture_routing(model) as recorder:
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    finally:
        for handle in handles:
            handle.remove()
    routing = recorder.routing(*batch.input_ids.shape)
    kept = torch.stack([t.reshape(*batch.input_ids.shape, -1) for t in logits])  # (layers,B,L,E)
    assert torch.equal(routing.entropy, router_entropy(kept))
    mask = predicting_positions(batch.response_mask).float()
    old = router_entropy_per_layer(kept, mask)  # today's metric, from the logits
    assert torch.equal(masked_mean_per_layer(routing.entropy, mask), old)
    metrics = routing_metrics(routing, routing, mask)
    assert metrics[M.MOE_ROUTER_ENTROPY] == float(old.mean())


def old_pass(
    moe_dir: Path, batch: RolloutBatch, arm_name: str, budget: int | None
) -> tuple[StepRouting, torch.Tensor, torch.Tensor, dict[str, float], list[int]]:
    """(routing, pi_old log-probs, entropies, moe/* metrics, tokens of each forward of the first
    router) of one step's no-grad passes."""
    arm = make_arm(name=arm_name, **ARMS[arm_name])
    cfg = LearnerConfig(prompts_per_step=4, old_logprobs="recompute", micro_batch_tokens=budget)
    models = build_step_models(moe_dir, arm, cfg, total_steps=1)
    routing = models.routing
    assert isinstance(routing, MoeRouting)
    tokens: list[int] = []
    router = router_modules(models.policy.module)[0]
    handle = router.register_forward_hook(lambda _m, _a, out: tokens.append(out[0].shape[0]))
    try:
        scores = _score(models, batch, cfg, PLAIN)
        step = routing.step  # the step's routing, pi_old's record; `metrics` lets it go
        assert step is not None
        metrics = routing.metrics(batch.response_mask)
    finally:
        handle.remove()
    return step, scores.learner_lp, scores.entropy, metrics, tokens


def token_tol(moe_dir: Path, batch: RolloutBatch, reduced: int = 0) -> float:
    """How far a per-token value of the no-grad forward (a log-prob, an entropy, a router
    entropy), or a mean of `reduced` of them, may differ between a part's forward and the whole
    batch's (another GEMM shape, fewer padded keys): reorder_tol over its forward chain (plus
    the mean's terms), terms of magnitude <= TERM_SCALE."""
    assert float(batch.behavior_logprobs.abs().max()) <= TERM_SCALE  # the model's own, on-policy
    chain = forward_chain(AutoConfig.from_pretrained(moe_dir), batch.input_ids.shape[1])
    return reorder_tol(chain + reduced, TERM_SCALE)


@pytest.mark.parametrize("arm_name", list(ARMS))
def test_routing_captured_per_part_is_the_whole_batchs(
    moe_dir: Path, batch: RolloutBatch, arm_name: str
) -> None:
    whole, whole_lp, whole_entropy, whole_metrics, _ = old_pass(moe_dir, batch, arm_name, None)
    split, split_lp, split_entropy, split_metrics, tokens = old_pass(
        moe_dir, batch, arm_name, BUDGET
    )
    # Every forward is one part's: pi_old, (rollout: the own-routing pass,) the metrics pass.
    parts = step_parts(batch, BUDGET)
    passes = 3 if arm_name == "grpo_replay_rollout" else 2
    assert tokens == [part.rows.numel() * part.width for part in parts] * passes
    assert whole.old is not None and split.old is not None
    real, response = batch.attention_mask.bool(), batch.response_mask.bool()
    assert torch.equal(split.old.indices[:, real], whole.old.indices[:, real])  # exactly
    tol = token_tol(moe_dir, batch)  # per token: rounding along its forward chain
    entropies = split.old.entropy[:, real], whole.old.entropy[:, real]
    torch.testing.assert_close(*entropies, rtol=0, atol=tol)
    # pi_old (under rollout replay: on the generator's experts of each part's rows and width).
    torch.testing.assert_close(split_lp[response], whole_lp[response], rtol=0, atol=tol)
    torch.testing.assert_close(split_entropy[response], whole_entropy[response], rtol=0, atol=tol)
    assert split_metrics.keys() == whole_metrics.keys()
    for key, value in whole_metrics.items():
        if key == M.MOE_ROUTER_ENTROPY:  # a mean over layers x real positions of the above
            layers = AutoConfig.from_pretrained(moe_dir).num_hidden_layers
            mean_tol = token_tol(moe_dir, batch, layers * int(real.sum()))
            assert abs(split_metrics[key] - value) <= mean_tol, (split_metrics[key], value)
        else:  # ratios of counts of the same experts (equal at every real position): exact
            assert split_metrics[key] == value, key
    assert split_metrics[M.MOE_ROUTING_CHANGE_FRAC] == 0.0  # no update between the passes
    if arm_name == "grpo_replay_rollout":
        assert split_metrics[M.MOE_ROLLOUT_ROUTING_MISMATCH] > 0.0  # another model's routing


class Steps(NamedTuple):
    """Two steps' policy parameters, grad norms, metrics and AdamW updates (`lockstep`)."""

    params: list[torch.Tensor]
    norms: list[float]
    metrics: list[dict[str, float]]
    updates: list[Update]


def two_steps(
    moe_dir: Path,
    batch: RolloutBatch,
    arm_name: str,
    budget: int | None,
    *,
    checkpointing: bool = False,
    follow: Steps | None = None,
) -> Steps:
    """Two steps on `batch`; with `follow`, in lockstep with that run (each update starts from
    its weights and AdamW state: tests/learner/lockstep.py)."""
    arm = make_arm(name=arm_name, **ARMS[arm_name])
    settings = {
        "prompts_per_step": PROMPTS,
        "minibatches": MINIBATCHES,
        "ppo_epochs": 2,
        "lr": LR,
    }
    cfg = LearnerConfig(
        old_logprobs="recompute",
        micro_batch_tokens=budget,
        activation_checkpointing=checkpointing,
        **settings,
    )
    models = build_step_models(moe_dir, arm, cfg, total_steps=2)
    norms, metrics = [], []
    with recording([models.policy], None if follow is None else [follow.updates]) as (recorder,):
        for step in range(2):
            result = train_on_batch(
                models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=step
            )
            norms += result.grad_norms
            metrics.append(result.metrics)
    assert [u.norm for u in recorder.updates] == norms  # the recorder saw the step's gradients
    params = [p.detach().clone() for p in models.policy.module.parameters()]
    return Steps(params, norms, metrics, recorder.updates)


@pytest.mark.parametrize("arm_name", list(ARMS))
def test_micro_batched_moe_steps_train_the_same_weights(
    moe_dir: Path, batch: RolloutBatch, arm_name: str
) -> None:
    plain = two_steps(moe_dir, batch, arm_name, None)
    split = two_steps(moe_dir, batch, arm_name, BUDGET, follow=plain)
    initial = [p.detach() for p in tiny_moe().parameters()]
    trained = max(float((a - b).abs().max()) for a, b in zip(plain.params, initial, strict=True))
    assert trained > 1e-3  # the updates compared train
    assert len(plain.updates) == 8  # 2 steps x 2 epochs x 2 minibatches
    config, width = AutoConfig.from_pretrained(moe_dir), batch.input_ids.shape[1]
    # Gradients, norms, weights: update by update, within the bounds of tests/learner/lockstep.py.
    # A gradient coordinate sums per-token terms over the minibatch's positions (rows x width),
    # each through one token's forward and backward chain.
    positions = PROMPTS // MINIBATCHES * GROUP_SIZE * width
    n = positions + forward_chain(config, width) + backward_chain(config, width)
    max_norm = LearnerConfig().grad_clip
    check_lockstep(plain.updates, split.updates, n=n, max_norm=max_norm, what="policy")
    # The step batch's positions x layers for `moe/*`: a bound for every metric.
    n = config.num_hidden_layers * batch.batch_size * width + forward_chain(config, width)
    assert all(any(key.startswith("moe/") for key in whole) for whole in plain.metrics)
    check_step_metrics(split.metrics, plain.metrics, n)


@pytest.mark.parametrize("arm_name", ["grpo_replay_old", "grpo_replay_rollout"])
def test_routing_replay_holds_through_a_checkpointed_backward(
    moe_dir: Path, batch: RolloutBatch, arm_name: str
) -> None:
    """`learner.activation_checkpointing` recomputes each block in backward: the replay's router
    hooks must still be there (`update.accumulate`'s `around`), or the recompute routes the
    tokens anew and torch's checkpoint refuses the mismatch (it used to fail at the first
    backward with CheckpointError). With them, the steps train what they train without
    checkpointing, bit for bit on CPU."""
    plain = two_steps(moe_dir, batch, arm_name, BUDGET)
    checkpointed = two_steps(moe_dir, batch, arm_name, BUDGET, checkpointing=True)
    assert checkpointed.norms == plain.norms  # the same computation in the same order: exact
    assert all(torch.equal(a, b) for a, b in zip(checkpointed.params, plain.params, strict=True))
