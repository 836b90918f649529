"""One optimizer update of a minibatch, in micro-batches: partition, accumulation, checks.

With `learner.micro_batch_tokens` a minibatch's gradient is accumulated over micro-batches and
the optimizer steps once per minibatch (`accumulate`). The budget counts *padded* tokens, rows x
the micro-batch's width (its longest prompt + response), because that is the shape the forward
runs on: activations and logits scale with it, prompt and padding included. Rows are sorted by
length (longest first, stable) before they are packed greedily, so rows of similar length share a
micro-batch and little of the budget is padding. A row longer than the budget is a micro-batch
of its own: a sequence is never split, since its loss terms (GSPO's sequence ratio, a
per-sequence mean) need all its tokens in one forward.

The partition changes no result beyond float rounding: every part's terms are reduced with the
whole minibatch's totals (`learner.algorithms.objectives.reduce_loss`, `LossTotals`), so
micro-batch gradients sum to the minibatch's whatever the grouping. What each part keeps of its
one loss call (its terms and stats, without a graph) is put back in the share's rows
(`assemble`) for the minibatch's metrics.

Data parallel: every rank holds the whole batch, so each rank plans every rank's share and
splits its own until all ranks have as many micro-batches as the one with the most: DDP
broadcasts module buffers (rotary frequencies) in every forward, so the ranks must run equal
numbers of forwards (FSDP2 gathers each block's parameters in every forward, so it needs that
too). Under DDP only the last micro-batch's backward all-reduces gradients; under FSDP every
micro-batch's backward reduce-scatters them (`_local_grads` says why).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from learner.runtime.distributed import DistContext, all_reduce_sum
from learner.runtime.sharding import full_tensor


class DivergenceError(RuntimeError):
    """A non-finite loss or gradient: the trial stops and is recorded as diverged."""


@dataclass
class Optimised:
    """A module with its optimiser and LR scheduler."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler


@dataclass(frozen=True)
class MicroBatch:
    """Rows of the step batch trained in one forward/backward."""

    rows: Tensor  # (b,) rows of the step batch, longest first
    local: Tensor  # (b,) the same rows' positions in their minibatch share
    width: int | None  # padded length: the longest row's real tokens; None = the batch's width


def take(x: Tensor, part: MicroBatch) -> Tensor:
    """`x`'s rows of the micro-batch, [b] or [b, width] (cut to its width)."""
    x = x[part.rows]
    return x if x.ndim == 1 or part.width is None else x[:, : part.width]


Kept = TypeVar("Kept")


def assemble(kept: list[Kept], parts: list[MicroBatch], rows: int, width: int) -> Kept:
    """The parts' outputs put back in their share's rows: each tensor [b, w] of a part goes to
    its rows (`part.local`) of a zero [rows, width] one, each [b] to a [rows] one; a NamedTuple
    is assembled field by field, and any other value (None, a name, a number) is the first
    part's. One part at the share's full width is returned as it is."""
    if len(parts) == 1 and parts[0].width is None:
        return kept[0]
    return _assemble(kept, parts, rows, width)


def _assemble(values: list[Any], parts: list[MicroBatch], rows: int, width: int) -> Any:
    first = values[0]
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a NamedTuple
        fields = [_assemble([v[i] for v in values], parts, rows, width) for i in range(len(first))]
        return type(first)(*fields)
    if not isinstance(first, Tensor):
        return first
    whole = first.new_zeros((rows,) if first.ndim == 1 else (rows, width))
    for value, part in zip(values, parts, strict=True):
        if value.ndim == 1:
            whole[part.local] = value
        else:
            whole[part.local, : value.shape[1]] = value
    return whole


def micro_batches(
    shares: Tensor, rank: int, lengths: Tensor, budget: int | None
) -> list[MicroBatch]:
    """Rank `rank`'s micro-batches of one minibatch.

    shares (W, b): each rank's rows of the minibatch (W = 1 single-process); lengths (B,): real
    tokens of every row of the step batch; budget: `learner.micro_batch_tokens` (None: the whole
    share at the batch's width, one forward as without micro-batches).
    """
    own = shares[rank]  # (b,)
    if budget is None:
        return [MicroBatch(own, torch.arange(own.numel()), None)]
    sizes = lengths.tolist()  # one transfer; the planning is plain integers
    plans = [_pack([sizes[row] for row in share.tolist()], budget) for share in shares]
    groups = _split_to(plans[rank], max(len(plan) for plan in plans))
    own_sizes = [sizes[row] for row in own.tolist()]
    return [
        MicroBatch(own[torch.tensor(g)], torch.tensor(g), max(own_sizes[i] for i in g))
        for g in groups
    ]


def _pack(sizes: list[int], budget: int) -> list[list[int]]:
    """Greedy packing of rows (positions into `sizes`) sorted longest first (stable): a row
    joins the current micro-batch while rows x its width (its first row's size) fit."""
    groups: list[list[int]] = []
    width = 0
    for position in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        if groups and (len(groups[-1]) + 1) * width <= budget:
            groups[-1].append(position)
        else:
            groups.append([position])  # a row over the budget alone: never split
            width = sizes[position]
    return groups


def _split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """Halve the micro-batch with the most rows (the first of equals) until there are `count`.

    Possible while count <= rows, which holds: every rank has as many rows, and no rank has
    more micro-batches than rows. Halves keep the longest-first order; each is within budget.
    """
    groups = list(groups)
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda i: (len(groups[i]), -i))
        if len(groups[largest]) < 2:
            raise ValueError(
                f"cannot split {len(groups)} micro-batches of single rows into {count}"
            )
        half = (len(groups[largest]) + 1) // 2
        groups[largest : largest + 1] = [groups[largest][:half], groups[largest][half:]]
    return groups


def check_finite(name: str, value: Tensor | float) -> None:
    number = float(value.detach()) if isinstance(value, Tensor) else float(value)
    if not math.isfinite(number):
        raise DivergenceError(f"non-finite {name} ({number})")


def _non_finite(name: str, loss: Tensor, dist: DistContext) -> float:
    """Single-process: raise at once on a non-finite loss. DDP: 1.0 if it is, for
    `_raise_on_every_rank` to raise on every rank together."""
    if dist.world_size == 1:
        check_finite(name, loss)
        return 0.0
    return float(not torch.isfinite(loss.detach()))


def _raise_on_every_rank(name: str, bad: float, dist: DistContext) -> None:
    """DDP: raise on every rank if any rank had a non-finite loss (one all-reduce)."""
    if dist.world_size == 1:
        return
    ranks = int(all_reduce_sum(torch.tensor([float(bad > 0)], dtype=torch.float64), dist))
    if ranks > 0:
        raise DivergenceError(f"non-finite {name} on {ranks} of {dist.world_size} ranks")


def _local_grads(module: nn.Module, *, keep: bool) -> contextlib.AbstractContextManager[None]:
    """While `keep`, DDP's gradients accumulate locally with no all-reduce (`no_sync`).

    FSDP reduce-scatters after every micro-batch instead: turning its sync off would keep every
    unit's *unsharded* float32 gradient until the last micro-batch (4 bytes a parameter on
    every rank, the memory sharding exists to save); synced, each rank accumulates only its
    shard, at the price of one reduce-scatter per micro-batch."""
    if keep and isinstance(module, DistributedDataParallel):
        return module.no_sync()
    return contextlib.nullcontext()


def _nothing(_part: MicroBatch) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


def accumulate(
    opt: Optimised,
    parts: list[MicroBatch],
    part_loss: Callable[[MicroBatch], tuple[Tensor, Kept]],
    *,
    max_norm: float,
    dist: DistContext,
    what: str,
    around: Callable[[MicroBatch], AbstractContextManager[None]] | None = None,
) -> tuple[float, list[Kept]]:
    """One clipped optimizer step on the sum of the micro-batches' gradients; returns the
    gradient norm and what each part kept (`part_loss`: a part -> its loss and what to keep of
    it, without a graph).

    `around(part)` is entered around a part's forward *and* its backward: MoE routing replay,
    whose router hooks must still be in place when activation checkpointing recomputes the
    blocks in backward (else the recompute routes the tokens anew and the saved tensors no
    longer match).

    Each part's loss divides by the whole minibatch's totals, so the sum is the minibatch's
    gradient; DDP averages over ranks, hence the one loss scale, x world_size. Under DDP only
    the last backward all-reduces (`no_sync` before it), and a non-finite loss on any rank is
    raised on every rank before that backward (one all-reduce), so no rank is left waiting.
    """
    opt.optimizer.zero_grad(set_to_none=True)
    kept: list[Kept] = []
    bad = 0.0
    for k, part in enumerate(parts):
        last = k == len(parts) - 1
        with _local_grads(opt.module, keep=not last), (around or _nothing)(part):
            loss, keep = part_loss(part)
            bad += _non_finite(f"{what} loss", loss, dist)
            if last:
                _raise_on_every_rank(f"{what} loss", bad, dist)
            (loss if dist.world_size == 1 else loss * dist.world_size).backward()
        kept.append(keep)
    grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(opt.module.parameters(), max_norm))
    check_finite(f"{what} gradient norm", grad_norm)
    opt.optimizer.step()
    opt.scheduler.step()
    return float(grad_norm), kept
