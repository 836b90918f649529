"""Data-parallel learner under `torchrun`: process group, batch broadcast, metric reduction.

Only rank 0 talks to Redis; it collates each step's batch and sends it to every rank with plain
tensor broadcasts (a shape header, then each field). Nothing is pickled: no rank ever unpickles
bytes that came over the network. Every rank then holds the same batch, trains its share of each
minibatch under DistributedDataParallel (or FSDP2, `learner.runtime.sharding`), and stays in
lockstep with the others through that broadcast. With WORLD_SIZE unset or 1 nothing here starts
a process group (but for FSDP's group of one) and every function is a no-op, so single-process
runs are unchanged bit for bit.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from buffer.collate import RolloutBatch
from contract import metrics as M

# The other ranks wait in the batch broadcast while rank 0 takes groups from Redis (up to the
# learner's take timeout, 600 s by default) and evaluates; the collective timeout must exceed both.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)

# RolloutBatch fields in broadcast order, with their dtypes (buffer/collate.py).
_FIELDS: tuple[tuple[str, torch.dtype], ...] = (
    ("input_ids", torch.int64),
    ("attention_mask", torch.int64),
    ("response_mask", torch.float32),
    ("behavior_logprobs", torch.float32),
    ("rewards", torch.float32),
    ("group_index", torch.int64),
    ("prompt_lengths", torch.int64),
    ("response_lengths", torch.int64),
    ("policy_versions", torch.int64),
    ("truncated", torch.bool),
)
_2D_FIELDS = frozenset({"input_ids", "attention_mask", "response_mask", "behavior_logprobs"})


@dataclass(frozen=True)
class DistContext:
    """This process's place in the data-parallel group (rank 0 of 1 when single-process)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


SINGLE = DistContext()


def init_distributed(device: str, *, group_of_one: bool = False) -> DistContext:
    """Join torchrun's process group (WORLD_SIZE, RANK, LOCAL_RANK); single-process without it.

    NCCL on cuda (after pinning this process to GPU LOCAL_RANK), gloo on cpu. `group_of_one`: a
    single process still forms a process group of one (FSDP2 shards over a device mesh even at
    one rank, `learner.parallel=fsdp`); everything else here stays a no-op at one rank.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        if group_of_one and not torch_dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            backend = "nccl" if device == "cuda" else "gloo"
            torch_dist.init_process_group(backend, rank=0, world_size=1)
        return SINGLE
    ctx = DistContext(int(os.environ["RANK"]), world_size, int(os.environ["LOCAL_RANK"]))
    backend = "gloo"
    if device == "cuda":
        torch.cuda.set_device(ctx.local_rank)
        backend = "nccl"
    torch_dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    return ctx


def barrier(ctx: DistContext) -> None:
    """Every rank waits here (no-op single-process): e.g. for rank 0's files to be in place."""
    if ctx.world_size > 1:
        torch_dist.barrier()


def shutdown(ctx: DistContext) -> None:
    """Leave the process group once every rank got here (no rank exits mid-collective)."""
    if torch_dist.is_initialized():
        if ctx.world_size > 1:
            torch_dist.barrier()
        torch_dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel wrapper (state dicts, eval, no-grad passes)."""
    return module.module if isinstance(module, DistributedDataParallel) else module


def _comm_device() -> torch.device:
    """NCCL moves CUDA tensors only; gloo CPU tensors."""
    if torch_dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_batch(batch: RolloutBatch | None, ctx: DistContext) -> RolloutBatch:
    """Rank 0's collated batch on every rank (on the CPU, as `collate` returns it).

    Rank 0 passes its batch, the others None. First an int64 header (B, L, routing layers,
    routing top-k; 0, 0 without `routed_experts`), then every field.
    """
    if ctx.world_size == 1:
        assert batch is not None, "a single process must pass its own batch"
        return batch
    device = _comm_device()
    header = torch.zeros(4, dtype=torch.int64, device=device)
    if ctx.is_main:
        assert batch is not None, "rank 0 must pass the batch it collated"
        routed = batch.routed_experts
        routing = (routed.shape[0], routed.shape[-1]) if routed is not None else (0, 0)
        header.copy_(torch.tensor([*batch.input_ids.shape, *routing]))
    torch_dist.broadcast(header, src=0)
    rows, width, layers, top_k = header.tolist()
    fields = {}
    for name, dtype in _FIELDS:
        shape = (rows, width) if name in _2D_FIELDS else (rows,)
        if ctx.is_main:
            tensor = getattr(batch, name).to(device=device, dtype=dtype).contiguous()
        else:
            tensor = torch.empty(shape, dtype=dtype, device=device)
        torch_dist.broadcast(tensor, src=0)
        fields[name] = tensor.cpu()
    if layers:  # the generator's experts (R3 routing replay), (layers, B, L, k) int64
        if ctx.is_main:
            assert batch is not None and batch.routed_experts is not None
            experts = batch.routed_experts.to(device=device).contiguous()
        else:
            experts = torch.empty((layers, rows, width, top_k), dtype=torch.int64, device=device)
        torch_dist.broadcast(experts, src=0)
        fields["routed_experts"] = experts.cpu()
    if ctx.is_main:
        return batch
    return RolloutBatch(**fields)


def all_reduce_sum(values: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Elementwise sum over ranks of a small tensor (returned on the tensor's own device)."""
    if ctx.world_size == 1:
        return values
    total = values.to(_comm_device()).clone()
    torch_dist.all_reduce(total, op=torch_dist.ReduceOp.SUM)
    return total.to(values.device)


def all_reduce_stats(stats: dict[str, float], ctx: DistContext) -> dict[str, float]:
    """Per-rank diagnostics -> global ones, each by its rule in contract.metrics.REDUCTIONS
    (mean over ranks, min for policy/ratio_min, max for policy/ratio_max), as `learner.runtime.step`
    combines minibatches. Every rank must pass the same keys; the result is identical on every
    rank."""
    if ctx.world_size == 1:
        return stats
    keys = sorted(stats)
    ops = {
        kind: (op, [k for k in keys if M.reduction(k) == kind])
        for kind, op in (
            ("min", torch_dist.ReduceOp.MIN),
            ("max", torch_dist.ReduceOp.MAX),
            ("sum", torch_dist.ReduceOp.SUM),
            ("mean", torch_dist.ReduceOp.SUM),
        )
    }
    last = [k for k in keys if M.reduction(k) == "last"]
    if last:
        raise ValueError(
            f"{last} reduce by `last`, which has no order across ranks; log them on rank 0 "
            "after the all-reduce"
        )
    out: dict[str, float] = {}
    for kind, (op, names) in ops.items():
        if not names:
            continue
        values = torch.tensor([stats[k] for k in names], dtype=torch.float64, device=_comm_device())
        torch_dist.all_reduce(values, op=op)
        if kind == "mean":
            values /= ctx.world_size
        out |= dict(zip(names, values.tolist(), strict=True))
    return {k: out[k] for k in stats}
