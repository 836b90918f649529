"""A step batch's routing record, assembled from micro-batch captures and kept in host memory.

`learner.runtime.moe.routing.StepRouting` keeps pi_old's routing of the whole step batch from the
start of the step to the `moe/*` metrics after the updates: each token's experts (`index_dtype`, one
byte a choice up to 256 experts) and router entropy (float32), every sparse layer. The record
lives in host memory, pinned when the forwards run on a CUDA device (`host_copy`), so the
device holds a capture only while a micro-batch's forward makes it; replay and the metrics move
one micro-batch's slice (`cut`) to the device when they need it. On a CPU learner the host is
the device, and a capture of the whole batch is the record itself, without a copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from learner.runtime.moe.hooks import RoutingRecord, capture_routing
from learner.runtime.update import MicroBatch


def host_copy(tensor: Tensor) -> Tensor:
    """`tensor` in host memory: itself when it is there, else a copy in pinned memory (the
    device's copies to and from it are then direct, without a pageable staging buffer)."""
    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor)


def cut(record: Tensor, rows: Tensor, width: int | None) -> Tensor:
    """Rows `rows` of a record (layers, B, L, ...) up to position `width` (None: all), where
    the record is kept: a micro-batch's slice, to move to the device."""
    return record[:, rows.to(record.device), :width]


def blank_routing(like: RoutingRecord, batch: int, length: int) -> RoutingRecord:
    """A `batch` x `length` routing with `like`'s layers, top-k, experts and index dtype, in
    host memory (pinned when `like` is on a CUDA device), before any micro-batch is placed in
    it (`place`).

    What stays of it is at the positions no micro-batch computes, beyond its width: padding
    only (a part is as wide as its longest row). There every token gets experts 0..k-1 (a valid
    set, as `buffer.collate` fills the generator's unrecorded positions) and entropy 0. Neither
    reaches a real token: a causal forward's output at p never depends on later positions (so
    replaying the fill into an update's padding changes no real token's log-prob), and the
    metrics read only positions that score a response token (`predicting_positions`)."""
    layers, _, _, top_k = like.indices.shape
    pinned = like.indices.is_cuda
    experts = torch.arange(top_k, dtype=like.indices.dtype).expand(layers, batch, length, top_k)
    indices = torch.empty(experts.shape, dtype=experts.dtype, pin_memory=pinned)
    entropy = torch.zeros(layers, batch, length, dtype=like.entropy.dtype, pin_memory=pinned)
    return RoutingRecord(indices.copy_(experts), entropy, like.num_experts)


def place(whole: RoutingRecord, piece: RoutingRecord, part: MicroBatch) -> None:
    """Write a micro-batch's routing (layers, b, width, ...) into its rows of `whole`, in place:
    rows `part.rows` of the step batch, positions up to the part's width."""
    width = piece.indices.shape[2]
    rows = part.rows.to(whole.indices.device)
    whole.indices[:, rows, :width] = piece.indices.to(whole.indices.device)
    whole.entropy[:, rows, :width] = piece.entropy.to(whole.entropy.device)


def is_whole(parts: list[MicroBatch]) -> bool:
    """One part at the batch's width (no `learner.micro_batch_tokens`): the batch itself, which
    is then used as it is, not copied row by row (`update.assemble` reads it the same way)."""
    return len(parts) == 1 and parts[0].width is None


def part_width(part: MicroBatch, length: int) -> int:
    """The positions the micro-batch's forward computes: its width, or the batch's (None)."""
    return length if part.width is None else part.width


class PartCaptures:
    """The step batch's routing record, captured one micro-batch forward at a time (`around`).

    One part at the batch's width (no `learner.micro_batch_tokens`) is the batch's routing as
    captured, bit for bit (copied to the host from a device); several are placed into one
    `blank_routing` as they come, so a part's capture is dropped before the next forward runs."""

    def __init__(self, policy: nn.Module, parts: list[MicroBatch], batch: int, length: int) -> None:
        self.policy, self.parts, self.batch, self.length = policy, parts, batch, length
        self.whole: RoutingRecord | None = None
        self.captured = 0

    @contextmanager
    def around(self, part: MicroBatch) -> Iterator[None]:
        with capture_routing(self.policy) as recorder:
            yield
        piece = recorder.routing(int(part.rows.numel()), part_width(part, self.length))
        del recorder  # the per-layer captures: only the stacked piece is left
        self.captured += 1
        if is_whole(self.parts):
            self.whole = RoutingRecord(
                host_copy(piece.indices), host_copy(piece.entropy), piece.num_experts
            )
            return
        if self.whole is None:
            self.whole = blank_routing(piece, self.batch, self.length)
        place(self.whole, piece, part)

    def routing(self) -> RoutingRecord:
        if self.whole is None or self.captured != len(self.parts):
            raise RuntimeError(
                f"routing captured for {self.captured} of {len(self.parts)} micro-batches: run "
                "each part's forward inside the context `StepRouting.capture_old` yields"
            )
        return self.whole
