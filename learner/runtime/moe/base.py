"""What a learner step asks of its policy's routing (`Routing`), and the dense policy's answer.

A step has three moments where an MoE policy's routers matter (`learner.runtime.moe` says why):
pi_old's pass at the start (capture its experts, or replay the generator's), every gradient
forward (replay them), and the `moe/*` metrics after the updates. `learner.runtime.step` calls
these three operations and nothing else of the MoE code, so a dense policy's step runs through
`NoRouting` alone: the choice is made once, when the learner builds its models
(`learner.runtime.moe.setup.setup_routing`), not on every step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from torch import Tensor

from learner.runtime.update import MicroBatch

LogProbs = Callable[[Tensor, Tensor], Tensor]
"""(input_ids, attention_mask) of a part -> the policy's log-probs [b, w], as its pi_old pass
scores them (`step._score`: sampling distribution, chunks of `learner.logprob_chunk_tokens`)."""

PartContext = Callable[[MicroBatch], AbstractContextManager[None]]
"""What `Routing.capture_old` yields: the context to enter around one micro-batch's forward."""


def no_part_context(_part: MicroBatch) -> AbstractContextManager[None]:
    """The `PartContext` that does nothing around any part (a dense policy's, or a pass that
    needs no routing: the reference's, the critic's)."""
    return contextlib.nullcontext()


class RoutedBatch(Protocol):
    """The step batch as routing reads it (`buffer.collate.RolloutBatch` is one): its tokens
    [B, L], their mask, and the generator's experts (layers, B, L, k) or None."""

    @property
    def input_ids(self) -> Tensor: ...
    @property
    def attention_mask(self) -> Tensor: ...
    @property
    def routed_experts(self) -> Tensor | None: ...


class Routing(Protocol):
    """The routing side of one learner step, in the order the step calls it.

    1. `capture_old(...)` wraps pi_old's no-grad pass over the step batch, run in `parts`
       (`learner.micro_batch_tokens`): it yields the context to enter around each part's
       forward, and once it exits the step's reference routing is kept;
    2. `replay(rows, width)` wraps a gradient forward of those rows of the batch (cut to
       `width` positions): the experts of `routing_replay` (R2 `old`, R3 `rollout`), if any;
    3. `metrics(mask, logprobs, old_lp)` returns the step's `moe/*` metrics after the updates
       (`logprobs` and pi_old's `old_lp` add routing's share of the log-ratio's variance), and
       ends the step.
    """

    def capture_old(
        self, batch: RoutedBatch, parts: list[MicroBatch]
    ) -> AbstractContextManager[PartContext]:
        """Start a step on `batch` [B, L] and wrap its pi_old pass."""
        ...

    def replay(self, rows: Tensor, width: int | None = None) -> AbstractContextManager[None]:
        """The context around a forward of `rows` of the step batch, up to `width` positions."""
        ...

    def metrics(
        self, mask: Tensor, logprobs: LogProbs | None = None, old_lp: Tensor | None = None
    ) -> dict[str, float]:
        """The step's `moe/*` metrics over the response `mask` [B, L]; ends the step."""
        ...


class NoRouting:
    """The `Routing` of a dense policy: no capture, no replay, no `moe/*` metrics."""

    def capture_old(
        self, batch: RoutedBatch, parts: list[MicroBatch]
    ) -> AbstractContextManager[PartContext]:
        return contextlib.nullcontext(no_part_context)

    def replay(self, rows: Tensor, width: int | None = None) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def metrics(
        self, mask: Tensor, logprobs: LogProbs | None = None, old_lp: Tensor | None = None
    ) -> dict[str, float]:
        return {}


NO_ROUTING = NoRouting()
"""The one `NoRouting` every dense learner shares: it holds no state."""
