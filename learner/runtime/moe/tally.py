"""The `moe/*` routing metrics of a step, counted one micro-batch part at a time.

`RoutingTally` adds each part's integer counts (tokens per expert under pi_old's routing, tokens
whose expert set the step's updates changed, per layer and in any layer, and the same against
the generator's experts under R3), so any split of the batch gives the whole batch's metrics
bit for bit; `routing_metrics` is the whole-batch form of the same tally. The counting
functions are `learner.runtime.moe.metrics`'; `learner.runtime.moe.routing.StepRouting` drives
the tally through a step.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from contract import metrics as M
from learner.runtime.moe.hooks import RoutingRecord
from learner.runtime.moe.metrics import (
    change_fraction,
    expert_counts_per_layer,
    load_imbalance_of_counts,
    masked_mean_per_layer,
    rerouted_counts,
)
from learner.runtime.moe.record import cut

MOE_METRICS = (
    M.MOE_LOAD_IMBALANCE,
    M.MOE_ROUTER_ENTROPY,
    M.MOE_ROUTING_CHANGE_FRAC,
    M.MOE_ROUTING_CHANGE_MAX,
    M.MOE_TOKEN_REROUTED_FRAC,
)
# only when the batch carries the generator's routing
ROLLOUT_METRICS = (M.MOE_ROLLOUT_ROUTING_MISMATCH, M.MOE_ROLLOUT_TOKEN_REROUTED_FRAC)


class RoutingTally:
    """The `moe/*` metrics' integer counts, added up one micro-batch part at a time (`add`):
    each layer's tokens per expert under `old` (load imbalance), its tokens whose expert set
    differs between `old` and `new` (routing change) or `old` and the generator's `rollout`
    (rollout mismatch), and the tokens that differ so in at least one layer (a part holds whole
    rows, every layer of them). Counts add exactly, so any split gives the whole batch's metrics
    bit for bit; the router entropy, a float mean, is taken from `old`'s whole record.

    `scored` (B, L) are the positions that count (`predicting_positions`), on the device."""

    def __init__(self, old: RoutingRecord, scored: Tensor, rollout: bool) -> None:
        layers = int(old.indices.shape[0])
        self.old, self.scored, self.scored_host = old, scored, scored.cpu()
        self.experts = torch.zeros(layers, old.num_experts, dtype=torch.float64)  # on the host
        self.changed = torch.zeros(layers, dtype=torch.int64, device=scored.device)
        self.rerouted = torch.zeros((), dtype=torch.int64, device=scored.device)  # any layer
        self.mismatched = torch.zeros_like(self.changed) if rollout else None
        self.mismatched_tokens = torch.zeros_like(self.rerouted) if rollout else None

    def add(self, rows: Tensor, width: int | None, new: Tensor, rollout: Tensor | None) -> None:
        """Count rows `rows` up to `width` (a part; None: every position): `new` and `rollout`
        are their experts (layers, b, width, k) on the device; `old`'s are cut from its record."""
        old = cut(self.old.indices, rows, width)  # (layers, b, width, k) where the record is
        scored_host = self.scored_host[rows, :width]  # (b, width)
        self.experts += expert_counts_per_layer(old, scored_host, self.old.num_experts)
        old = old.to(new.device)  # one part's experts on the device
        scored = self.scored[rows.to(self.scored.device), :width]  # (b, width)
        per_layer, anywhere = rerouted_counts(old, new, scored)
        self.changed += per_layer
        self.rerouted += anywhere
        if self.mismatched is not None and self.mismatched_tokens is not None:
            assert rollout is not None
            per_layer, anywhere = rerouted_counts(old, rollout, scored)
            self.mismatched += per_layer
            self.mismatched_tokens += anywhere

    def metrics(self) -> dict[str, float]:
        """Each metric averaged over layers (`MOE_METRICS`, and `ROLLOUT_METRICS` with a
        rollout), and each layer's routing change (`M.moe_routing_change_layer`), all NaN when
        no position is scored."""
        names = MOE_METRICS + (ROLLOUT_METRICS if self.mismatched is not None else ())
        layers = [M.moe_routing_change_layer(i) for i in range(int(self.changed.shape[0]))]
        if not bool(self.scored.any()):
            return {name: math.nan for name in (*names, *layers)}
        stats = {}
        if self.mismatched is not None and self.mismatched_tokens is not None:
            mismatch = change_fraction(self.mismatched, self.scored)
            stats[M.MOE_ROLLOUT_ROUTING_MISMATCH] = float(mismatch.mean())
            tokens = change_fraction(self.mismatched_tokens, self.scored)
            stats[M.MOE_ROLLOUT_TOKEN_REROUTED_FRAC] = float(tokens)
        entropy = masked_mean_per_layer(self.old.entropy, self.scored)  # one layer at a time
        change = change_fraction(self.changed, self.scored)  # [layers]
        return (
            stats
            | {
                M.MOE_LOAD_IMBALANCE: float(load_imbalance_of_counts(self.experts).mean()),
                M.MOE_ROUTER_ENTROPY: float(entropy.mean()),
                M.MOE_ROUTING_CHANGE_FRAC: float(change.mean()),
                M.MOE_ROUTING_CHANGE_MAX: float(change.max()),
                M.MOE_TOKEN_REROUTED_FRAC: float(change_fraction(self.rerouted, self.scored)),
            }
            | dict(zip(layers, change.tolist(), strict=True))
        )


def routing_metrics(
    old: RoutingRecord, new: RoutingRecord, mask: Tensor, rollout: Tensor | None = None
) -> dict[str, float]:
    """The registered `moe/*` metrics of whole-batch captures, each averaged over layers.

    Load imbalance and router entropy describe `old` (the policy at the start of the step, like
    `policy/entropy`); the change fraction compares `old` with `new` (after the step's updates).
    Given the generator's `rollout` experts (layers, B, L, k), the rollout mismatch compares them
    with `old`: the share of positions where the learner's own router picks another expert set
    than the sampler did (what R3 replay removes). A step counts them part by part instead
    (`StepRouting.metrics`), with the same `RoutingTally`.
    """
    mask = mask.float()
    tally = RoutingTally(old, mask, rollout is not None)
    every = torch.arange(mask.shape[0])
    device = mask.device
    tally.add(every, None, new.indices.to(device), None if rollout is None else rollout.to(device))
    return tally.metrics()
