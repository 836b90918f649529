"""The naive-vs-decoupled identity through the real learner step, at fixed lag 1.

With the clip off, `naive` (ratio pi_theta / mu, no weight) and `decoupled` (ratio
pi_theta / pi_prox times the constant weight rho = pi_prox / mu) give every token the same term
-A pi_theta / mu and the same gradient -A (pi_theta / mu) grad log pi_theta, at every pi_theta:
in every minibatch and epoch of a step, not only the first (`learner.algorithms.corrections`).
The pure objectives cannot break that; the runtime can, by handing the objective the wrong
logprobs as pi_old or the weights of the wrong rows. So this drives what the learner loop runs per
step (`collate`, then `train_on_batch`) on a real tiny policy, with rollouts sampled by the torch
generator from the previous version's weights (lag 1), and checks that two arms differing only in
the correction take the same gradients and sample the same rewards step after step.

GRPO only: for GSPO the identity does not hold by design. Naive GSPO scales a sequence's term by
s_i = exp(mean_t log pi_theta / mu) = s'_i rho_geo, decoupled GSPO by s'_i mean_t rho_t (the mean
of its token weights), and the arithmetic mean exceeds the geometric one whenever rho varies
along the sequence. GSPO-token weights each token by its own rho_t instead of rho_geo.
"""

from __future__ import annotations

import copy

import torch

from buffer.collate import collate
from buffer.rollout_group import RolloutGroup
from contract import metrics as M
from harness.generators.torch_backend import TorchGenerator
from learner.algorithms.sampling_dist import PLAIN
from learner.config import LearnerConfig, make_arm
from learner.runtime.models import build_step_models
from tests.learner.rollout_steps import group_requests, sampled_groups, train_step
from tests.learner.tiny import save_tiny_policy
from tests.tiny_models import RAW_IDS

GROUP_SIZE = 4
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14, 15]]
MAX_NEW_TOKENS = 6
STEPS = 4
LAG = 1
LR = 1e-2
# The clip off: ratios are clipped below 1 - eps_low = 1e-6 and above 1 + 1e6 only.
NO_CLIP = {"eps_low": 0.999999, "eps_high": 1e6}


def reward(response: list[int]) -> float:
    """A verifier of the tiny vocabulary: the share of even token ids in the response."""
    return sum(token % 2 == 0 for token in response) / len(response)


def rewards(responses: list[list[int]]) -> list[float]:
    """A group's rewards: each response verified on its own."""
    return [reward(ids) for ids in responses]


def rollouts(behaviour: torch.nn.Module, step: int, version: int) -> list[RolloutGroup]:
    """Step `step`'s groups, sampled and scored by the weights of `version` (the generator's
    seeded sampler: the same weights give the same tokens)."""
    generator = TorchGenerator.around(
        behaviour, sampling=PLAIN, eos_token_id=RAW_IDS.eos, pad_token_id=RAW_IDS.pad
    )
    requests = group_requests(PROMPTS, GROUP_SIZE, MAX_NEW_TOKENS, seed=0, step=step)
    return sampled_groups(generator, requests, rewards, version)


def train_at_fixed_lag(model_dir, correction: str) -> list[dict]:
    """STEPS learner steps; step k trains on groups sampled by version max(0, k - LAG)."""
    arm = make_arm(name=correction, objective="grpo", correction=correction, **NO_CLIP)
    cfg = LearnerConfig(prompts_per_step=len(PROMPTS), minibatches=2, ppo_epochs=2, lr=LR)
    models = build_step_models(model_dir, arm, cfg, total_steps=STEPS)
    policy = models.policy.module
    versions: list[torch.nn.Module] = []  # versions[v]: the weights after v steps
    steps = []
    for step in range(STEPS):
        versions.append(copy.deepcopy(policy).eval())
        version = max(0, step - LAG)
        groups = rollouts(versions[version], step, version)
        batch = collate(groups, pad_id=RAW_IDS.pad)  # as the learner loop builds a step's batch
        result = train_step(
            models, batch, arm, cfg, group_size=GROUP_SIZE, max_len=MAX_NEW_TOKENS, version=step
        )
        steps.append(
            {
                "responses": [[list(map(int, r)) for r in g.response_ids] for g in groups],
                "rewards": batch.rewards.tolist(),
                "grad_norms": result.grad_norms,
                "metrics": result.metrics,
            }
        )
    return steps


def test_naive_equals_decoupled_without_clip_at_lag_one(tmp_path) -> None:
    model_dir = save_tiny_policy(tmp_path / "model")
    naive = train_at_fixed_lag(model_dir, "naive")
    decoupled = train_at_fixed_lag(model_dir, "decoupled")
    for step, (a, b) in enumerate(zip(naive, decoupled, strict=True)):
        # The same rollouts: the previous versions agree closely enough to sample the same tokens.
        assert a["responses"] == b["responses"], step
        assert a["rewards"] == b["rewards"], step
        assert len(a["grad_norms"]) == 4  # ppo_epochs 2 x minibatches 2
        # Observed: <= 2e-7 at steps 0-1, growing to ~1.5e-5 by step 3 as float32 rounding
        # (exp(l - mu) against exp(l - pi_prox) exp(pi_prox - mu)) compounds through AdamW.
        for na, nb in zip(a["grad_norms"], b["grad_norms"], strict=True):
            assert abs(na - nb) <= 1e-4 * na, (step, a["grad_norms"], b["grad_norms"])
        assert a["metrics"][M.POLICY_CLIP_FRAC] == b["metrics"][M.POLICY_CLIP_FRAC] == 0.0
    # Not vacuous: step 0 trains on version 0's own samples, but from step 1 the rows are one
    # version old, pi_prox != mu, and the two arms carry the gap differently: decoupled in its
    # weights rho != 1, naive in its ratio.
    for step in range(1, STEPS):
        gap = decoupled[step]["metrics"][M.STALENESS_KL_BEHAVIOR]
        assert gap > 1e-4, (step, gap)
        assert abs(decoupled[step]["metrics"][M.OFFPOLICY_WEIGHT_MEAN] - 1.0) > 1e-3
