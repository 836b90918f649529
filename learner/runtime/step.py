"""One learner step on one batch: advantages, then `ppo_epochs` x `minibatches` updates.

The step reads top to bottom like the paper's algorithm box: pick pi_old, compute advantages,
loop over epochs and minibatches computing the arm's objective, clip gradients, update.
Everything that differs between arms is declared by the arm's config model
(`learner.config.arms`): the objective, its options, its advantage estimator, its critic and its
loss units; the loss itself is `learner.algorithms.objectives.POLICY_LOSSES[arm.objective]`.
"""

from __future__ import annotations

import math
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
from learner.algorithms.objectives import POLICY_LOSSES, value_loss
from learner.algorithms.sampling_dist import PLAIN, SamplingSettings
from learner.config import ArmBase, GroupArm, LearnerConfig
from learner.runtime.distributed import (
    SINGLE,
    DistContext,
    all_reduce_stats,
    all_reduce_sum,
    unwrap,
)
from learner.runtime.forward import policy_logprobs, scoring
from learner.runtime.moe import StepRouting
from learner.vocabulary import LossUnits


class DivergenceError(RuntimeError):
    """A non-finite loss or gradient: the trial stops and is recorded as diverged."""


@dataclass
class Optimised:
    """A module with its optimiser and LR scheduler."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler


@dataclass
class StepModels:
    policy: Optimised
    value: Optimised | None = None
    reference: nn.Module | None = None


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
        return estimator(batch.rewards, lengths, group_size, arm.adv_norm), None
    assert old_values is not None, "GAE needs the value model's estimates"
    token_rewards = terminal_token_rewards(batch.rewards, batch.response_mask)  # (B, T)
    advantages, returns = gae(
        token_rewards, old_values, batch.response_mask, learner.gamma, learner.lam
    )
    return whiten(advantages, batch.response_mask), returns


def loss_units(arm: ArmBase) -> LossUnits:
    """What the arm's policy loss averages over (`ArmBase.loss_units`): `tokens` (token-mean:
    DAPO, PPO) or `sequences` (non-empty rows: GSPO, GSPO-token, GRPO seq-mean-*). Data-parallel
    ranks rescale by it."""
    return arm.loss_units


def _count_units(mask: Tensor, units: LossUnits) -> Tensor:
    """Response tokens, or non-empty rows, of a [B, T] response mask."""
    if units == "tokens":
        return mask.bool().sum()
    return (mask.bool().sum(-1) > 0).sum()


def check_group_split(n_groups: int, minibatches: int, world_size: int) -> None:
    """Each rank trains whole groups of every minibatch, so each minibatch's group count must be
    a multiple of the world size."""
    sizes = [len(g) for g in torch.arange(n_groups).tensor_split(minibatches)]
    if any(size % world_size for size in sizes):
        per_step = minibatches * world_size
        raise ValueError(
            f"learner.prompts_per_step={n_groups} in learner.minibatches={minibatches} gives "
            f"minibatches of {sizes} groups, which {world_size} data-parallel ranks cannot split "
            f"into whole groups; make learner.prompts_per_step a multiple of learner.minibatches "
            f"x world size (e.g. {per_step * max(1, n_groups // per_step)}) "
            f"or change --nproc_per_node"
        )


def _rank_rows(rows: Tensor, dist: DistContext) -> Tensor:
    """This rank's share of a minibatch's rows: rows are whole groups, contiguous, so equal
    chunks are whole groups (check_group_split)."""
    return rows.reshape(dist.world_size, -1)[dist.rank]  # (B_mb / W,)


def _global_share(loss: Tensor, local_units: Tensor, dist: DistContext, what: str) -> Tensor:
    """The rank's loss scaled by world_size * local_units / global_units.

    Each rank's objective averages over its own units (tokens or sequences); DDP averages the
    ranks' gradients. With the factor, that average is the gradient of the loss over the whole
    minibatch: mean_r W u_r / U * grad(S_r / u_r) = grad(sum_r S_r) / U. The same all_reduce
    carries a non-finite flag, so every rank raises the divergence together (none is left
    waiting in backward). Single-process: only the finite check, no factor.
    """
    if dist.world_size == 1:
        _check_finite(what, loss)
        return loss
    not_finite = (~torch.isfinite(loss.detach())).double().cpu()
    local = torch.stack([local_units.double().cpu(), not_finite])
    total_units, n_bad = all_reduce_sum(local, dist).tolist()
    if n_bad > 0:
        raise DivergenceError(f"non-finite {what} on {int(n_bad)} of {dist.world_size} ranks")
    return loss * (dist.world_size * float(local[0]) / max(total_units, 1.0))


def _group_slices(n_groups: int, group_size: int, minibatches: int) -> list[Tensor]:
    """Row indices of each minibatch: whole groups, contiguous, as even as possible."""
    groups = torch.arange(n_groups).tensor_split(minibatches)
    return [
        (g[:, None] * group_size + torch.arange(group_size)[None, :]).reshape(-1) for g in groups
    ]


def _check_finite(name: str, value: Tensor | float) -> None:
    number = float(value.detach()) if isinstance(value, Tensor) else float(value)
    if not math.isfinite(number):
        raise DivergenceError(f"non-finite {name} ({number})")


def _update(opt: Optimised, loss: Tensor, max_norm: float, what: str) -> float:
    opt.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(opt.module.parameters(), max_norm)
    _check_finite(f"{what} gradient norm", grad_norm)
    opt.optimizer.step()
    opt.scheduler.step()
    return float(grad_norm)


def _merge(acc: dict[str, list[float]], stats: dict[str, float], prefix: str) -> None:
    for key, value in stats.items():
        acc.setdefault(f"{prefix}{key}", []).append(value)


def _reduce(acc: dict[str, list[float]]) -> dict[str, float]:
    """Each metric over the step's updates, by its rule in contract.metrics.REDUCTIONS."""
    return {key: M.combine(key, values) for key, values in acc.items()}


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
    policy, reference) and the logged entropy are of the sampling
    distribution `sampling` (the generators' temperature / top-k / top-p,
    `learner.runtime.forward`). Passes without a gradient run in eval mode (`scoring`), gradient
    passes in train mode.

    Data-parallel (`dist.world_size > 1`, modules wrapped by `learner.runtime.models.wrap_ddp`):
    every rank holds the whole batch, computes pi_old and advantages on all of it, and trains its
    share of whole groups of each minibatch; metrics are averaged over ranks.
    """
    ddp_policy = models.policy.module
    policy = unwrap(ddp_policy)  # no-grad passes and MoE hooks skip the DDP wrapper
    value = models.value.module if models.value else None
    ids, attn, mask = batch.input_ids, batch.attention_mask, batch.response_mask
    acc: dict[str, list[float]] = {}
    # MoE routing (learner/moe.py; no-op for dense): capture pi_old's experts, replay, measure.
    routing = StepRouting(policy, arm.routing_replay, ids, attn, batch.routed_experts)
    critic = unwrap(value) if value else None
    with scoring(policy, models.reference, critic):  # eval mode + no_grad
        with routing.capture_old():
            learner_lp, entropy = policy_logprobs(policy, ids, attn, sampling)  # (B, T) each
        ref_lp = None
        if models.reference is not None:
            ref_lp = policy_logprobs(models.reference, ids, attn, sampling)[0]
        old_values = critic(ids, attn) if critic is not None else None
    # The arm's off-policy correction (learner.algorithms.corrections): pi_old and the weights.
    correction = arm.correction_for(learner)
    is_weights, offpolicy = correction_weights(
        correction, learner_lp, batch.behavior_logprobs, mask
    )
    old_lp = learner_lp if correction.uses_proximal else batch.behavior_logprobs
    advantages, returns = compute_advantages(arm, batch, group_size, learner, old_values)
    objective = POLICY_LOSSES[arm.objective]
    options = arm.objective_options(max_len)  # built once per step
    result = StepResult()
    n_groups = batch.rewards.shape[0] // group_size
    units = loss_units(arm)
    if dist.world_size > 1:
        check_group_split(n_groups, learner.minibatches, dist.world_size)
    for _epoch in range(learner.ppo_epochs):
        for minibatch in _group_slices(n_groups, group_size, learner.minibatches):
            rows = _rank_rows(minibatch, dist) if dist.world_size > 1 else minibatch
            with routing.replay(rows):  # MoE routing replay (routing_replay: old | rollout)
                logprobs, _ = policy_logprobs(ddp_policy, ids[rows], attn[rows], sampling)
            loss, stats = objective(
                logprobs,
                old_lp[rows],
                advantages[rows],
                mask[rows],
                options,
                is_weights=None if is_weights is None else is_weights[rows],
                ref_logprobs=None if ref_lp is None else ref_lp[rows],
            )
            loss = _global_share(loss, _count_units(mask[rows], units), dist, "policy loss")
            result.grad_norms.append(_update(models.policy, loss, learner.grad_clip, "policy"))
            _merge(acc, stats, "policy/")
            if models.value is not None:
                assert value is not None and old_values is not None and returns is not None
                values = value(ids[rows], attn[rows])
                v_loss, v_stats = value_loss(
                    values, old_values[rows], returns[rows], mask[rows], clip=learner.value_clip
                )
                v_units = _count_units(mask[rows], "tokens")  # value_loss is a token mean
                v_loss = _global_share(v_loss, v_units, dist, "value loss")
                _update(models.value, v_loss, learner.grad_clip, "value")
                _merge(acc, v_stats, "value/")
    metrics = all_reduce_stats(_reduce(acc), dist)  # the rest is the same on every rank
    with torch.no_grad():
        metrics[M.POLICY_ENTROPY] = float((entropy * mask).sum() / mask.sum().clamp_min(1))
    metrics |= {_OFFPOLICY_KEYS[key]: value for key, value in offpolicy.items()}
    metrics |= behavior_gaps(learner_lp, batch, version)
    metrics[M.OPTIM_GRAD_NORM] = M.combine(M.OPTIM_GRAD_NORM, result.grad_norms)
    metrics[M.OPTIM_LR] = models.policy.scheduler.get_last_lr()[0]
    with scoring(policy):
        metrics |= routing.metrics(mask)  # moe/* after the updates (MoE only)
    result.metrics = metrics
    return result
