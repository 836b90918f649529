"""One learner step on one batch: advantages, then `ppo_epochs` x `minibatches` updates.

The step reads top to bottom like the paper's algorithm box: pick pi_old, compute advantages,
loop over epochs and minibatches computing the arm's objective, clip gradients, update. A
minibatch may be trained in micro-batches (`learner.micro_batch_tokens`,
`learner.runtime.update`): their gradients accumulate and the optimizer steps once per
minibatch; every part's terms are reduced with the whole minibatch's totals (`LossTotals`), so
the gradient is the unsplit minibatch's (`learner.runtime.minibatch`).
Everything that differs between arms is declared by the arm's config model
(`learner.config.arms`): the objective and the settings it reads (the arm itself), its
advantage estimator, its critic and its loss units; the objective itself is
`learner.algorithms.objectives.POLICY_LOSSES[arm.objective]`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from buffer.collate import RolloutBatch
from contract import metrics as M
from learner.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    gae,
    terminal_token_rewards,
    whiten,
)
from learner.algorithms.corrections import correction_weights
from learner.algorithms.kl import kl_from_log_ratio
from learner.algorithms.masking import masked_mean
from learner.algorithms.objectives import POLICY_LOSSES, LossTotals
from learner.algorithms.sampling_dist import PLAIN, SamplingSettings
from learner.config import ArmBase, GroupArm, LearnerConfig, group_split_problem
from learner.runtime.distributed import SINGLE, DistContext, all_reduce_stats, unwrap
from learner.runtime.forward import policy_logprobs, scoring
from learner.runtime.minibatch import MinibatchUpdates, RowTensors, StepModels
from learner.runtime.moe.base import PartContext, no_part_context
from learner.runtime.update import (
    DivergenceError,
    MicroBatch,
    Optimised,
    assemble,
    micro_batches,
    take,
)
from learner.vocabulary import LossUnits

__all__ = [  # DivergenceError, Optimised and StepModels live next door, re-exported here
    "DivergenceError",
    "Optimised",
    "StepModels",
    "StepResult",
    "behavior_gaps",
    "check_group_split",
    "compute_advantages",
    "loss_units",
    "train_on_batch",
]


@dataclass
class StepResult:
    """Averaged diagnostics of one step (keys are design section 7 names)."""

    metrics: dict[str, float] = field(default_factory=dict)
    grad_norms: list[float] = field(default_factory=list)


def compute_advantages(
    arm: ArmBase,
    batch: RolloutBatch,
    group_size: int,
    learner: LearnerConfig,
    old_values: Tensor | None,
) -> tuple[Tensor, Tensor | None]:
    """(advantages, returns) of the arm's declared kind: one per sequence [B] from the arm's
    `adv_estimator` (GSPO, GRPO; returns None) or whitened GAE [B, T] with lambda-returns (PPO).

    Computed on the whole step batch before it is split into minibatches; under data
    parallelism every rank holds that whole batch, so a batch statistic (REINFORCE++'s mean and
    std) is the same on every rank."""
    if isinstance(arm, GroupArm):
        estimator = ADVANTAGE_ESTIMATORS[arm.adv_estimator]
        lengths = batch.response_mask.sum(dim=-1)  # (B,) response tokens per sequence
        return estimator(batch.rewards, lengths, group_size, arm.adv_norm, arm.adv_std), None
    assert old_values is not None, "GAE needs the value model's estimates"
    token_rewards = terminal_token_rewards(batch.rewards, batch.response_mask)  # (B, T)
    advantages, returns = gae(
        token_rewards, old_values, batch.response_mask, learner.gamma, learner.lam
    )
    return whiten(advantages, batch.response_mask), returns


def loss_units(arm: ArmBase) -> LossUnits:
    """What the arm's policy loss averages over (`ArmBase.loss_units`): `tokens` (token-mean:
    DAPO, PPO) or `sequences` (non-empty rows: GSPO, GSPO-token, GRPO seq-mean-*)."""
    return arm.loss_units


def check_group_split(n_groups: int, minibatches: int, world_size: int) -> None:
    """Each rank trains whole groups of every minibatch, so each minibatch's group count must be
    a multiple of the world size (`learner.config.group_split_problem`)."""
    problem = group_split_problem(n_groups, minibatches, world_size)
    if problem is not None:
        raise ValueError(problem)


def _group_slices(n_groups: int, group_size: int, minibatches: int) -> list[Tensor]:
    """Row indices of each minibatch: whole groups, contiguous, as even as possible."""
    groups = torch.arange(n_groups).tensor_split(minibatches)
    return [
        (g[:, None] * group_size + torch.arange(group_size)[None, :]).reshape(-1) for g in groups
    ]


@torch.no_grad()
def behavior_gaps(learner_lp: Tensor, batch: RolloutBatch, version: int) -> dict[str, float]:
    """k3 KL(behaviour || learner at `version`), split into the engine gap and the staleness gap.

    Rows generated by the learner's current version compare the same weights on two engines:
    that is the engine gap (`mismatch/kl_behavior`). Rows from older versions add staleness on
    top (`staleness/kl_behavior`). Each is NaN when no row qualifies (e.g. at fixed lag > 0 there
    is no same-version row; the engine gap shows in lag-0 trials of the same setup).
    """
    response = batch.response_mask.bool()
    log_ratio = learner_lp - batch.behavior_logprobs.float()  # log pi_learner / pi_behaviour
    kl_t = kl_from_log_ratio(log_ratio, "k3")  # (B, T)
    gaps = {}
    for name, rows in (
        (M.MISMATCH_KL_BEHAVIOR, batch.policy_versions == version),
        (M.STALENESS_KL_BEHAVIOR, batch.policy_versions < version),
    ):
        where = rows[:, None] & response  # (B, T)
        gaps[name] = float(masked_mean(kl_t, where)) if where.any() else math.nan
    return gaps


def _device_of(module: nn.Module) -> torch.device:
    """Where the module computes (a sharded parameter's local shard lives there too)."""
    return next(module.parameters()).device


def _no_grad_pass(
    score: Callable[[Tensor, Tensor], tuple[Tensor, ...]],
    ids: Tensor,
    attn: Tensor,
    parts: list[MicroBatch],
    around: PartContext = no_part_context,
) -> tuple[Tensor, ...]:
    """`score(ids, attn)`'s per-token outputs [B, L] over the step batch, computed part by part
    (`learner.micro_batch_tokens`) and put back in place (float32); one call on the batch itself
    when there is one part at the batch's width (no budget), exactly as without micro-batches.
    Each part's call runs inside `around(part)` (MoE: pi_old's routing capture or replay)."""
    if len(parts) == 1 and parts[0].width is None:
        with around(parts[0]):
            return score(ids, attn)
    outputs = []
    for part in parts:
        with around(part):
            outputs.append(score(take(ids, part), take(attn, part)))
    return tuple(
        assemble([output[k].float() for output in outputs], parts, *attn.shape)
        for k in range(len(outputs[0]))
    )


@dataclass(frozen=True)
class _Scores:
    """The step batch's no-gradient passes, [B, T] each: pi_old at the step's start (learner
    log-probs), its entropy, the reference's log-probs and the critic's old values."""

    learner_lp: Tensor
    entropy: Tensor
    ref_lp: Tensor | None
    old_values: Tensor | None


def _score(
    models: StepModels, batch: RolloutBatch, learner: LearnerConfig, sampling: SamplingSettings
) -> _Scores:
    """The passes without a gradient run in micro-batches of the same budget (every rank the
    same ones). An MoE policy's pi_old pass too: `models.routing.capture_old` starts the step's
    routing, captures (or, under `routing_replay: rollout`, replays) each part's routing around
    its forward and puts the parts back in the batch's rows, and the `moe/*` routing pass after
    the updates reuses these parts (`Routing.metrics`), so neither holds more than one
    micro-batch's activations."""
    policy, chunk = unwrap(models.policy.module), learner.logprob_chunk_tokens
    critic = unwrap(models.value.module) if models.value else None
    ids, attn = batch.input_ids, batch.attention_mask
    lengths = attn.sum(-1).cpu()  # (B,) real tokens per row, for the micro-batch plans
    rows = torch.arange(ids.shape[0])[None, :]  # (1, B): one share of every row
    every_row = micro_batches(rows, 0, lengths, learner.micro_batch_tokens)
    with scoring(policy, models.reference, critic):  # eval mode + no_grad
        with models.routing.capture_old(batch, every_row) as around:  # R3: generator's experts
            learner_lp, entropy = _no_grad_pass(  # (B, T) each
                lambda i, a: policy_logprobs(policy, i, a, sampling, chunk),
                ids,
                attn,
                every_row,
                around,
            )
        ref_lp = old_values = None
        if (reference := models.reference) is not None:
            (ref_lp,) = _no_grad_pass(
                lambda i, a: policy_logprobs(reference, i, a, sampling, chunk)[:1],
                ids,
                attn,
                every_row,
            )
        if critic is not None:
            (old_values,) = _no_grad_pass(lambda i, a: (critic(i, a),), ids, attn, every_row)
    return _Scores(learner_lp, entropy, ref_lp, old_values)


def _train(
    updates: MinibatchUpdates, n_groups: int, group_size: int, lengths: Tensor
) -> tuple[dict[str, list[float]], list[float]]:
    """Every epoch's minibatch updates: (each metric's values, the policy's gradient norms)."""
    learner, dist, mask = updates.learner, updates.dist, updates.rows.mask
    if dist.world_size > 1:
        check_group_split(n_groups, learner.minibatches, dist.world_size)
    acc: dict[str, list[float]] = {}
    grad_norms = []
    for _epoch in range(learner.ppo_epochs):
        for minibatch in _group_slices(n_groups, group_size, learner.minibatches):
            shares = minibatch.reshape(dist.world_size, -1)  # (W, b): each rank's whole groups
            parts = micro_batches(shares, dist.rank, lengths, learner.micro_batch_tokens)
            totals = LossTotals.of(mask[minibatch])  # the whole minibatch: every rank's rows
            grad_norm, metrics = updates.policy(shares[dist.rank], parts, totals)
            grad_norms.append(grad_norm)
            if updates.models.value is not None:
                metrics |= updates.value(shares[dist.rank], parts, totals)
            for name, value in metrics.items():
                acc.setdefault(name, []).append(value)
    return acc, grad_norms


_OFFPOLICY_KEYS = {
    "weight_mean": M.OFFPOLICY_WEIGHT_MEAN,
    "ess_frac": M.OFFPOLICY_ESS_FRAC,
    "masked_frac": M.OFFPOLICY_MASKED_FRAC,
    "trunc_frac": M.OFFPOLICY_TRUNC_FRAC,
}


def train_on_batch(
    models: StepModels,
    batch: RolloutBatch,
    *,
    arm: ArmBase,
    learner: LearnerConfig,
    group_size: int,
    max_len: int,
    version: int,
    dist: DistContext = SINGLE,
    sampling: SamplingSettings = PLAIN,
) -> StepResult:
    """Run the step's updates at policy `version`; raise DivergenceError on a non-finite loss or
    gradient.

    pi_old and the weights multiplying each term come from the arm's off-policy correction
    (`ArmBase.correction_for`, `learner.algorithms.corrections`). Every log-prob (pi_old, current
    policy, reference) and the logged entropy are of the sampling distribution `sampling` (the
    generators' temperature / top-k / top-p, `learner.runtime.forward`). Passes without a
    gradient run in eval mode (`scoring`), gradient passes in train mode.

    Data-parallel (`dist.world_size > 1`, modules wrapped by `learner.runtime.models.wrap_ddp`):
    every rank holds the whole batch, computes pi_old and advantages on all of it, and trains its
    share of whole groups of each minibatch, in micro-batches (`learner.micro_batch_tokens`);
    metrics are averaged over ranks. The passes without a gradient run in micro-batches of the
    same budget (`_score`); log-probs in chunks of `learner.logprob_chunk_tokens` positions.
    """
    policy = unwrap(models.policy.module)  # no-grad passes and MoE hooks skip the DDP wrapper
    batch = batch.to(_device_of(policy))  # collated (and broadcast) on the CPU
    ids, attn, mask = batch.input_ids, batch.attention_mask, batch.response_mask
    # MoE routing (`models.routing`, a no-op for dense): capture pi_old's experts, replay, measure.
    scores = _score(models, batch, learner, sampling)
    # The arm's off-policy correction (learner.algorithms.corrections): pi_old and the weights.
    correction = arm.correction_for(learner)
    is_weights, offpolicy = correction_weights(
        correction, scores.learner_lp, batch.behavior_logprobs, mask
    )
    old_lp = scores.learner_lp if correction.uses_proximal else batch.behavior_logprobs
    advantages, returns = compute_advantages(arm, batch, group_size, learner, scores.old_values)
    rows = RowTensors(
        ids, attn, mask, old_lp, advantages, is_weights, scores.ref_lp, scores.old_values, returns
    )
    objective = POLICY_LOSSES[arm.objective]
    updates = MinibatchUpdates(models, rows, objective, arm, max_len, learner, sampling, dist)
    n_groups = batch.rewards.shape[0] // group_size
    acc, grad_norms = _train(updates, n_groups, group_size, attn.sum(-1).cpu())
    metrics = all_reduce_stats({k: M.combine(k, v) for k, v in acc.items()}, dist)
    with torch.no_grad():  # the rest is the same on every rank
        entropy = (scores.entropy * mask).sum() / mask.sum().clamp_min(1)
        metrics[M.POLICY_ENTROPY] = float(entropy)
    metrics |= {_OFFPOLICY_KEYS[key]: value for key, value in offpolicy.items()}
    metrics |= behavior_gaps(scores.learner_lp, batch, version)
    metrics[M.OPTIM_GRAD_NORM] = M.combine(M.OPTIM_GRAD_NORM, grad_norms)
    metrics[M.OPTIM_LR] = models.policy.scheduler.get_last_lr()[0]
    with scoring(policy):  # moe/* after the updates (MoE only): eval mode, no RNG drawn
        logprobs = _logprobs_of(policy, learner, sampling)
        metrics |= models.routing.metrics(mask, logprobs, scores.learner_lp)
    return StepResult(metrics, grad_norms)


def _logprobs_of(
    policy: nn.Module, learner: LearnerConfig, sampling: SamplingSettings
) -> Callable[[Tensor, Tensor], Tensor]:
    """The policy's log-probs of (ids, attn) as its pi_old pass scores them (`_score`): the
    sampling distribution, `learner.logprob_chunk_tokens` positions of logits at a time."""
    chunk = learner.logprob_chunk_tokens
    return lambda ids, attn: policy_logprobs(policy, ids, attn, sampling, chunk)[0]
