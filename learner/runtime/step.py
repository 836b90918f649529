"""One learner step on one batch: advantages, then `ppo_epochs` x `minibatches` updates.

The step reads top to bottom like the paper's algorithm box: pick pi_old, compute advantages,
loop over epochs and minibatches computing the arm's objective, clip gradients, update. A
minibatch may be trained in micro-batches (`learner.micro_batch_tokens`,
`learner.runtime.update`): their gradients accumulate and the optimizer steps once per
minibatch; every loss divides by the whole minibatch's totals (`LossTotals`), so the gradient
is the unsplit minibatch's.
Everything that differs between arms is declared by the arm's config model
(`learner.config.arms`): the objective, its options, its advantage estimator, its critic and its
loss units; the loss itself is `learner.algorithms.objectives.POLICY_LOSSES[arm.objective]`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields

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
from learner.algorithms.objectives import (
    POLICY_LOSSES,
    LossTotals,
    ObjectiveOptions,
    PolicyLoss,
    Stats,
    value_loss,
)
from learner.algorithms.sampling_dist import PLAIN, SamplingSettings
from learner.config import ArmBase, GroupArm, LearnerConfig, group_split_problem
from learner.runtime.distributed import (
    SINGLE,
    DistContext,
    all_reduce_stats,
    unwrap,
)
from learner.runtime.forward import policy_logprobs, scoring
from learner.runtime.moe import StepRouting
from learner.runtime.update import (
    DivergenceError,
    MicroBatch,
    Optimised,
    accumulate,
    micro_batches,
    take,
)
from learner.vocabulary import LossUnits

__all__ = [  # DivergenceError and Optimised live in learner.runtime.update, re-exported here
    "DivergenceError",
    "MinibatchUpdates",
    "Optimised",
    "RowTensors",
    "StepModels",
    "StepResult",
    "behavior_gaps",
    "check_group_split",
    "compute_advantages",
    "loss_units",
    "train_on_batch",
]


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


@dataclass(frozen=True)
class RowTensors:
    """The step's per-row tensors the updates read, [B] or [B, L]; None where absent."""

    ids: Tensor
    attn: Tensor
    mask: Tensor
    old_lp: Tensor
    advantages: Tensor
    is_weights: Tensor | None
    ref_lp: Tensor | None
    old_values: Tensor | None
    returns: Tensor | None

    def of(self, part: MicroBatch) -> RowTensors:
        """The micro-batch's rows, cut to its width."""
        cut = {f.name: getattr(self, f.name) for f in fields(self)}
        return RowTensors(**{k: None if v is None else take(v, part) for k, v in cut.items()})

    def share(self, rows: Tensor) -> RowTensors:
        """A rank's whole share of a minibatch, at the batch's width."""
        return self.of(MicroBatch(rows, torch.arange(rows.numel()), None))


def _assemble(outputs: list[Tensor], parts: list[MicroBatch], like: Tensor) -> Tensor:
    """The micro-batches' per-token outputs [b, width] put back in their share's rows [n, L]."""
    whole = torch.zeros(like.shape, dtype=torch.float32, device=like.device)  # (n, L)
    for output, part in zip(outputs, parts, strict=True):
        whole[part.local, : output.shape[1]] = output.float()
    return whole


def _device_of(module: nn.Module) -> torch.device:
    """Where the module computes (a sharded parameter's local shard lives there too)."""
    return next(module.parameters()).device


def _no_grad_pass(
    score: Callable[[Tensor, Tensor], tuple[Tensor, ...]],
    ids: Tensor,
    attn: Tensor,
    parts: list[MicroBatch],
) -> tuple[Tensor, ...]:
    """`score(ids, attn)`'s per-token outputs [B, L] over the step batch, computed part by part
    (`learner.micro_batch_tokens`) and put back in place; one call on the batch itself when
    there is one part at the batch's width (no budget), exactly as without micro-batches."""
    if len(parts) == 1 and parts[0].width is None:
        return score(ids, attn)
    outputs = [score(take(ids, part), take(attn, part)) for part in parts]
    return tuple(
        _assemble([output[k] for output in outputs], parts, attn) for k in range(len(outputs[0]))
    )


@dataclass(frozen=True)
class MinibatchUpdates:
    """The policy and critic updates of one step's minibatches, each in micro-batches.

    Stats: with one micro-batch on one process, the loss call's own; otherwise one more call
    (no gradient) on the share's whole outputs, so they equal the unsplit share's exactly as
    the loss computes them (a micro-batch's stats describe its rows only).
    """

    models: StepModels
    rows: RowTensors
    objective: PolicyLoss
    options: ObjectiveOptions
    learner: LearnerConfig
    sampling: SamplingSettings
    routing: StepRouting
    dist: DistContext

    def _logprobs(self, module: nn.Module, part: MicroBatch) -> Tensor:
        ids, attn = take(self.rows.ids, part), take(self.rows.attn, part)
        with self.routing.replay(part.rows, part.width):  # MoE routing replay (old | rollout)
            chunk = self.learner.logprob_chunk_tokens
            return policy_logprobs(module, ids, attn, self.sampling, chunk)[0]  # (b, width)

    def _split(self, parts: list[MicroBatch]) -> bool:
        return len(parts) > 1 or self.dist.world_size > 1

    def policy(
        self, share: Tensor, parts: list[MicroBatch], totals: LossTotals
    ) -> tuple[float, Stats]:
        """One policy update on this rank's `share` of a minibatch: (grad norm, stats)."""
        whole = self.rows.share(share) if self._split(parts) else None
        selected = None if whole is None or len(parts) == 1 else self._selection(whole, parts)

        def part_loss(part: MicroBatch) -> tuple[Tensor, Stats, Tensor]:
            t = self.rows.of(part)
            logprobs = self._logprobs(self.models.policy.module, part)
            picked = None if selected is None else selected[part.local, : part.width]
            loss, stats = self._policy_loss(logprobs, t, totals=totals, selected=picked)
            return loss, stats, logprobs.detach()

        grad_clip = self.learner.grad_clip
        grad_norm, stats, outputs = accumulate(
            self.models.policy, parts, part_loss, max_norm=grad_clip, dist=self.dist, what="policy"
        )
        if whole is not None:
            with torch.no_grad():
                logprobs = _assemble(outputs, parts, whole.mask)  # (n, L)
                # `selected`: the tokens the parts trained on (Clip-Cov, KL-Cov)
                _, stats = self._policy_loss(logprobs, whole, selected=selected)
                share_loss, _ = self._policy_loss(logprobs, whole, totals=totals, selected=selected)
            stats["loss"] = self._minibatch_loss(share_loss)
        return grad_norm, stats

    def _minibatch_loss(self, share_loss: Tensor) -> float:
        """The logged loss of a data-parallel minibatch: this rank's share of it (its terms over
        the whole minibatch's totals) x the world size, so that the mean over ranks
        (`all_reduce_stats`) is the sum of the shares, the minibatch's loss exactly as one
        process computes it. The other stats are the share's own, averaged over ranks."""
        return float(share_loss) * self.dist.world_size

    def _policy_loss(
        self,
        logprobs: Tensor,
        rows: RowTensors,
        *,
        totals: LossTotals | None = None,
        selected: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """The arm's objective on `rows` (a micro-batch or the whole share) at `logprobs`."""
        return self.objective(
            logprobs,
            rows.old_lp,
            rows.advantages,
            rows.mask,
            self.options,
            is_weights=rows.is_weights,
            ref_logprobs=rows.ref_lp,
            totals=totals,
            selected=selected,
        )

    def _selection(self, whole: RowTensors, parts: list[MicroBatch]) -> Tensor | None:
        """The loss's token selection over the whole share (Clip-Cov, KL-Cov; None for the
        others), from one no-grad forward per micro-batch at the weights of the update."""
        if self.objective.select is None:
            return None
        with torch.no_grad():
            policy = unwrap(self.models.policy.module)
            outputs = [self._logprobs(policy, part) for part in parts]
        logprobs = _assemble(outputs, parts, whole.mask)  # (n, L)
        return self.objective.selection(
            logprobs, whole.old_lp, whole.advantages, whole.mask, self.options
        )

    def value(self, share: Tensor, parts: list[MicroBatch], totals: LossTotals) -> Stats:
        """One critic update on this rank's `share` of a minibatch: its stats."""
        critic, clip = self.models.value, self.learner.value_clip
        assert critic is not None

        def part_loss(part: MicroBatch) -> tuple[Tensor, Stats, Tensor]:
            t = self.rows.of(part)
            values = critic.module(t.ids, t.attn)  # (b, width)
            loss, stats = value_loss(
                values, t.old_values, t.returns, t.mask, clip=clip, totals=totals
            )
            return loss, stats, values.detach()

        _, stats, outputs = accumulate(
            critic, parts, part_loss, max_norm=self.learner.grad_clip, dist=self.dist, what="value"
        )
        if self._split(parts):
            whole = self.rows.share(share)
            assert whole.old_values is not None and whole.returns is not None
            with torch.no_grad():
                values = _assemble(outputs, parts, whole.mask)  # (n, L)
                _, stats = value_loss(
                    values, whole.old_values, whole.returns, whole.mask, clip=clip
                )
                share_loss, _ = value_loss(
                    values, whole.old_values, whole.returns, whole.mask, clip=clip, totals=totals
                )
            stats["loss"] = self._minibatch_loss(share_loss)
        return stats


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
    share of whole groups of each minibatch; metrics are averaged over ranks. Each rank's share
    may be trained in micro-batches (`learner.micro_batch_tokens`); every loss divides by the
    whole minibatch's totals, so ranks and micro-batches add up to the minibatch's gradient.
    The passes without a gradient (pi_old, reference, old values) run in micro-batches of the
    same budget over the whole batch (but MoE's pi_old pass, whose routing capture is of one
    forward). Log-probs are computed in chunks of `learner.logprob_chunk_tokens` positions when
    set.
    """
    policy = unwrap(models.policy.module)  # no-grad passes and MoE hooks skip the DDP wrapper
    batch = batch.to(_device_of(policy))  # collated (and broadcast) on the CPU
    ids, attn, mask = batch.input_ids, batch.attention_mask, batch.response_mask
    chunk = learner.logprob_chunk_tokens
    acc: dict[str, list[float]] = {}
    # MoE routing (learner/moe.py; no-op for dense): capture pi_old's experts, replay, measure.
    routing = StepRouting(policy, arm.routing_replay, ids, attn, batch.routed_experts)
    critic = unwrap(models.value.module) if models.value else None
    lengths = attn.sum(-1).cpu()  # (B,) real tokens per row, for the micro-batch plans
    # The passes without a gradient run in micro-batches of the same budget (every rank the
    # same ones). MoE's pi_old pass stays whole: its routing capture is of one whole forward.
    rows = torch.arange(ids.shape[0])[None, :]  # (1, B): one share of every row
    every_row = micro_batches(rows, 0, lengths, learner.micro_batch_tokens)
    whole = micro_batches(rows, 0, lengths, None) if routing.active else every_row
    with scoring(policy, models.reference, critic):  # eval mode + no_grad
        with routing.capture_old():
            learner_lp, entropy = _no_grad_pass(  # (B, T) each
                lambda i, a: policy_logprobs(policy, i, a, sampling, chunk), ids, attn, whole
            )
        ref_lp = None
        if (reference := models.reference) is not None:
            (ref_lp,) = _no_grad_pass(
                lambda i, a: policy_logprobs(reference, i, a, sampling, chunk)[:1],
                ids,
                attn,
                every_row,
            )
        old_values = None
        if critic is not None:
            (old_values,) = _no_grad_pass(lambda i, a: (critic(i, a),), ids, attn, every_row)
    # The arm's off-policy correction (learner.algorithms.corrections): pi_old and the weights.
    correction = arm.correction_for(learner)
    is_weights, offpolicy = correction_weights(
        correction, learner_lp, batch.behavior_logprobs, mask
    )
    old_lp = learner_lp if correction.uses_proximal else batch.behavior_logprobs
    advantages, returns = compute_advantages(arm, batch, group_size, learner, old_values)
    tensors = RowTensors(
        ids, attn, mask, old_lp, advantages, is_weights, ref_lp, old_values, returns
    )
    objective, options = POLICY_LOSSES[arm.objective], arm.objective_options(max_len)
    updates = MinibatchUpdates(
        models, tensors, objective, options, learner, sampling, routing, dist
    )
    result = StepResult()
    n_groups = batch.rewards.shape[0] // group_size
    if dist.world_size > 1:
        check_group_split(n_groups, learner.minibatches, dist.world_size)
    for _epoch in range(learner.ppo_epochs):
        for minibatch in _group_slices(n_groups, group_size, learner.minibatches):
            shares = minibatch.reshape(dist.world_size, -1)  # (W, b): each rank's whole groups
            parts = micro_batches(shares, dist.rank, lengths, learner.micro_batch_tokens)
            totals = LossTotals.of(mask[minibatch])  # the whole minibatch: every rank's rows
            grad_norm, stats = updates.policy(shares[dist.rank], parts, totals)
            result.grad_norms.append(grad_norm)
            _merge(acc, stats, "policy/")
            if models.value is not None:
                _merge(acc, updates.value(shares[dist.rank], parts, totals), "value/")
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
