"""The policy and critic updates of one minibatch, each in micro-batches (`runtime.update`).

Each part (micro-batch) calls the objective once: its terms, reduced with the whole
minibatch's totals, give the part's loss and gradient; what the call returned is kept without
its graph. The parts' kept terms are put back in the share's rows (`update.assemble`), and the
share's metrics are computed from them once (`policy_metrics`, `value_metrics`): with one part
they are the call's own, bit for bit; with several, the whole share's up to float rounding
where a part computed a row sum or a transcendental at its own width. The logged loss is the
share's terms reduced once more (no graph) with the minibatch's totals, x the world size, so
that the mean over ranks (`all_reduce_stats`) is the minibatch's loss.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor, nn

from contract import metrics as M
from learner.algorithms.objectives import (
    LossTotals,
    PolicyBatch,
    PolicyObjective,
    PolicyTerms,
    ValueTerms,
    policy_metrics,
    reduce_loss,
    value_loss,
    value_metrics,
)
from learner.algorithms.sampling_dist import SamplingSettings
from learner.config import LearnerConfig
from learner.runtime.distributed import DistContext, unwrap
from learner.runtime.forward import policy_logprobs
from learner.runtime.moe.base import Routing
from learner.runtime.update import Kept, MicroBatch, Optimised, accumulate, assemble, take


@dataclass
class StepModels:
    """What a step trains and scores with: the policy, PPO's critic, the KL reference, and the
    policy's `routing` (`learner.runtime.moe`: MoE capture and replay, or the dense no-op),
    chosen once with the policy (`learner.runtime.models.build_step_models`)."""

    policy: Optimised
    value: Optimised | None = None
    reference: nn.Module | None = None
    routing: Routing = field(kw_only=True)


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


@dataclass(frozen=True)
class MinibatchUpdates:
    """The step's updates: `policy` and `value` each train one rank's share of a minibatch."""

    models: StepModels
    rows: RowTensors
    objective: PolicyObjective
    arm: Any  # the arm's frozen config: what the objective reads (`objectives.settings`)
    max_len: int  # the generation cap: Dr. GRPO's constant divisor
    learner: LearnerConfig
    sampling: SamplingSettings
    dist: DistContext

    def _logprobs(self, module: nn.Module, part: MicroBatch) -> Tensor:
        """The part's log-probs; call it inside `_replaying(part)` (MoE routing replay)."""
        ids, attn = take(self.rows.ids, part), take(self.rows.attn, part)
        chunk = self.learner.logprob_chunk_tokens
        return policy_logprobs(module, ids, attn, self.sampling, chunk)[0]  # (b, width)

    def _replaying(self, part: MicroBatch) -> AbstractContextManager[None]:
        """MoE routing replay (old | rollout) of the part's rows; a no-op otherwise."""
        return self.models.routing.replay(part.rows, part.width)

    def policy(
        self, share: Tensor, parts: list[MicroBatch], totals: LossTotals
    ) -> tuple[float, dict[str, float]]:
        """One policy update on this rank's `share` of a minibatch: (grad norm, metrics)."""
        selected = self._selection(share, parts)

        def part_loss(part: MicroBatch) -> tuple[Tensor, PolicyTerms]:
            t = self.rows.of(part)
            batch = PolicyBatch.of(
                self._logprobs(self.models.policy.module, part),
                t.old_lp,
                t.advantages,
                t.mask,
                is_weights=t.is_weights,
                ref_logprobs=t.ref_lp,
                selected=None if selected is None else selected[part.local, : part.width],
            )
            terms = self.objective(batch, self.arm)
            return reduce_loss(terms.loss, batch.lengths, totals, self.max_len), terms.detach()

        grad_clip = self.learner.grad_clip
        grad_norm, kept = accumulate(
            self.models.policy,
            parts,
            part_loss,
            max_norm=grad_clip,
            dist=self.dist,
            what="policy",
            around=self._replaying,  # its hooks stay through a checkpointed backward
        )
        terms, mask = self._whole(kept, parts, share)
        loss = reduce_loss(terms.loss, mask.sum(-1), totals, self.max_len)
        return grad_norm, self._scaled(policy_metrics(terms, mask, loss), M.POLICY_LOSS)

    def _selection(self, share: Tensor, parts: list[MicroBatch]) -> Tensor | None:
        """The objective's token selection over the whole share (Clip-Cov, KL-Cov; None for
        the others, or when the share is one part: the objective then selects on it itself),
        from one no-grad forward per micro-batch at the weights of the update."""
        if self.objective.select is None or len(parts) == 1:
            return None
        with torch.no_grad():
            policy = unwrap(self.models.policy.module)
            outputs = []
            for part in parts:
                with self._replaying(part):
                    outputs.append(self._logprobs(policy, part).float())
        mask = self.rows.mask[share]  # (n, L)
        logprobs = assemble(outputs, parts, *mask.shape)  # (n, L)
        whole = PolicyBatch.of(logprobs, self.rows.old_lp[share], self.rows.advantages[share], mask)
        return self.objective.selection(whole, self.arm)

    def value(self, share: Tensor, parts: list[MicroBatch], totals: LossTotals) -> dict[str, float]:
        """One critic update on this rank's `share` of a minibatch: its metrics."""
        critic = self.models.value
        assert critic is not None

        def part_loss(part: MicroBatch) -> tuple[Tensor, ValueTerms]:
            t = self.rows.of(part)
            values = critic.module(t.ids, t.attn)  # (b, width)
            terms = value_loss(values, t.old_values, t.returns, t.mask, self.learner.value_clip)
            return reduce_loss(terms.loss, t.mask.bool().sum(-1), totals), terms.detach()

        _, kept = accumulate(
            critic, parts, part_loss, max_norm=self.learner.grad_clip, dist=self.dist, what="value"
        )
        terms, mask = self._whole(kept, parts, share)
        loss = reduce_loss(terms.loss, mask.sum(-1), totals)
        return self._scaled(value_metrics(terms.stats, mask, loss), M.VALUE_LOSS)

    def _whole(
        self, kept: list[Kept], parts: list[MicroBatch], share: Tensor
    ) -> tuple[Kept, Tensor]:
        """The parts' kept terms in the share's rows, and the share's response mask [n, L]."""
        mask = self.rows.mask[share].bool()  # (n, L)
        return assemble(kept, parts, *mask.shape), mask

    def _scaled(self, metrics: dict[str, float], loss: str) -> dict[str, float]:
        """The logged loss of a data-parallel minibatch: this rank's share of it (its terms over
        the whole minibatch's totals) x the world size, so that the mean over ranks is the sum
        of the shares, the minibatch's loss exactly as one process computes it. The other
        metrics are the share's own, averaged over ranks."""
        metrics[loss] = metrics[loss] * self.dist.world_size
        return metrics
