"""One learner step on one batch: advantages, then `ppo_epochs` x `minibatches` updates.

The step reads top to bottom like the paper's algorithm box: pick pi_old, compute advantages,
loop over epochs and minibatches computing the arm's objective, clip gradients, update.
Everything that differs between arms is inside `objective_kwargs` and `compute_advantages`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from buffer import metric_names as M
from buffer.collate import RolloutBatch
from learner.advantages import gae, group_advantages, terminal_token_rewards, whiten
from learner.config import ArmConfig, LearnerConfig
from learner.forward import policy_logprobs
from learner.kl import kl_from_log_ratio, truncated_importance_weights
from learner.masking import masked_mean
from learner.moe import StepRouting
from learner.objectives import OBJECTIVES, value_loss


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
    arm: ArmConfig,
    batch: RolloutBatch,
    group_size: int,
    learner: LearnerConfig,
    old_values: Tensor | None,
) -> tuple[Tensor, Tensor | None]:
    """(advantages, returns): group-relative [B] for GSPO/GRPO, whitened GAE [B, T] for PPO."""
    if arm.objective != "ppo":
        return group_advantages(batch.rewards, group_size, arm.adv_norm), None
    assert old_values is not None, "PPO needs the value model's estimates"
    token_rewards = terminal_token_rewards(batch.rewards, batch.response_mask)  # (B, T)
    advantages, returns = gae(
        token_rewards, old_values, batch.response_mask, learner.gamma, learner.lam
    )
    return whiten(advantages, batch.response_mask), returns


def objective_kwargs(arm: ArmConfig, max_len: int) -> dict[str, object]:
    """The arm's clip range, aggregation and KL settings, in the objective's keyword names."""
    kwargs: dict[str, object] = {
        "eps_low": arm.eps_low,
        "eps_high": arm.eps_high,
        "beta": arm.beta,
        "kl_estimator": arm.kl_estimator,
    }
    if arm.objective == "grpo":
        kwargs.update(agg=arm.agg, max_len=max_len)
    return kwargs


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
    out = {}
    for key, values in acc.items():
        if key.endswith("ratio_min"):
            out[key] = min(values)
        elif key.endswith(("ratio_max", "is_weight_max")):
            out[key] = max(values)
        else:
            out[key] = sum(values) / len(values)
    return out


@torch.no_grad()
def engine_mismatch_kl(learner_lp: Tensor, batch: RolloutBatch, version: int) -> float:
    """k3 KL between behaviour and learner logprobs of the *same* weights (design section 6).

    Only rows generated with the learner's current version compare like with like; rows from
    older versions mix staleness into the gap, so they are left out (NaN when none qualify,
    e.g. at fixed lag > 0, where the engine gap shows in lag-0 trials of the same setup).
    """
    same = (batch.policy_versions == version)[:, None] & batch.response_mask.bool()  # (B, T)
    if not same.any():
        return math.nan
    log_ratio = learner_lp - batch.behavior_logprobs.float()  # log pi_learner / pi_behaviour
    return float(masked_mean(kl_from_log_ratio(log_ratio, "k3"), same))


def train_on_batch(
    models: StepModels,
    batch: RolloutBatch,
    *,
    arm: ArmConfig,
    learner: LearnerConfig,
    group_size: int,
    max_len: int,
    version: int,
) -> StepResult:
    """Run the step's updates at policy `version`; raise DivergenceError on a non-finite loss or
    gradient."""
    policy = models.policy.module
    ids, attn, mask = batch.input_ids, batch.attention_mask, batch.response_mask
    acc: dict[str, list[float]] = {}
    # MoE routing (learner/moe.py; no-op for dense): capture pi_old's experts, replay, measure.
    routing = StepRouting(policy, arm.routing_replay, ids.shape)
    with torch.no_grad():
        with routing.capture_old():
            learner_lp, entropy = policy_logprobs(policy, ids, attn)  # (B, T) each
        ref_lp = policy_logprobs(models.reference, ids, attn)[0] if models.reference else None
        old_values = models.value.module(ids, attn) if models.value else None
    is_weights, is_stats = truncated_importance_weights(
        learner_lp, batch.behavior_logprobs, mask, learner.is_cap
    )
    if learner.old_logprobs == "recompute":
        old_lp = learner_lp
    else:
        old_lp, is_weights = batch.behavior_logprobs, None
    advantages, returns = compute_advantages(arm, batch, group_size, learner, old_values)
    objective = OBJECTIVES[arm.objective]
    kwargs = objective_kwargs(arm, max_len)
    result = StepResult()
    n_groups = batch.rewards.shape[0] // group_size
    for _epoch in range(learner.ppo_epochs):
        for rows in _group_slices(n_groups, group_size, learner.minibatches):
            with routing.replay(rows):  # MoE routing replay (routing_replay: old)
                logprobs, _ = policy_logprobs(policy, ids[rows], attn[rows])
            loss, stats = objective(
                logprobs,
                old_lp[rows],
                advantages[rows],
                mask[rows],
                is_weights=None if is_weights is None else is_weights[rows],
                ref_logprobs=None if ref_lp is None else ref_lp[rows],
                **kwargs,
            )
            _check_finite("policy loss", loss)
            result.grad_norms.append(_update(models.policy, loss, learner.grad_clip, "policy"))
            _merge(acc, stats, "policy/")
            if models.value is not None:
                assert old_values is not None and returns is not None
                values = models.value.module(ids[rows], attn[rows])
                v_loss, v_stats = value_loss(
                    values, old_values[rows], returns[rows], mask[rows], clip=learner.value_clip
                )
                _check_finite("value loss", v_loss)
                _update(models.value, v_loss, learner.grad_clip, "value")
                _merge(acc, v_stats, "value/")
    metrics = _reduce(acc)
    with torch.no_grad():
        metrics[M.POLICY_ENTROPY] = float((entropy * mask).sum() / mask.sum().clamp_min(1))
    metrics[M.MISMATCH_IS_WEIGHT_MEAN] = is_stats["is_weight_mean"]
    metrics[M.MISMATCH_KL_BEHAVIOR] = engine_mismatch_kl(learner_lp, batch, version)
    metrics[M.OPTIM_GRAD_NORM] = sum(result.grad_norms) / len(result.grad_norms)
    metrics[M.OPTIM_LR] = models.policy.scheduler.get_last_lr()[0]
    metrics |= routing.metrics(ids, attn, mask)  # moe/* after the updates (MoE only)
    result.metrics = metrics
    return result
