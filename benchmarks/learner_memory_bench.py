"""Learner memory per rank and tokens/s under DDP, FSDP and its scale options, side by side.

Each setting trains the same GSPO batch with `learner.runtime.step.train_on_batch` on models
built by `learner.runtime.models.build_step_models` (+ `wrap_ddp`), as the learner does:

    single       1 rank, no data parallelism (the baseline)
    ddp          N ranks, DistributedDataParallel: every rank holds the whole model and AdamW
    fsdp         N ranks, FSDP2 (`learner.parallel=fsdp`): parameters, gradients, AdamW split
    fsdp_micro   + `learner.micro_batch_tokens` (gradient accumulation)
    fsdp_ckpt    + `learner.activation_checkpointing`
    fsdp_all     + micro-batches + activation checkpointing + `learner.logprob_chunk_tokens`
    fsdp_bf16    + `learner.dtype=bfloat16` (bf16 compute, float32 master weights and AdamW)
    fsdp_micro_bf16  micro-batches + bf16
    fsdp_all_bf16    micro-batches + checkpointing + chunked log-probs + bf16: the options of
                 the GSPO paper's setting in `harness plan` (issue 40)

The model is a random-init Qwen2 with a 32k vocabulary saved to a temporary directory (nothing
is downloaded), or, with `--model-config PATH`, that config.json (say
`configs/model_configs/qwen3-30b-a3b.json`: its hidden size, attention, experts and vocabulary)
at random init with `--layers` decoder layers, so an MoE's per-layer memory is measured at the
real model's width. Every setting runs in fresh processes (forked from a forkserver that imported
torch once): one warm-up update, then `--updates` timed ones. Per rank it records

- memory before the models are built (after imports and joining the process group), after
  build + shard (parameters read once: transformers maps the weights file without copying, so
  its pages count only once touched), the peak while building and the peak during the timed
  updates;
- the exact bytes of parameters, gradients and optimizer state the rank holds (a DTensor
  counts its local shard, `to_local()`), after the last update;
- each update's wall time; tokens/s = real (non-padding) tokens all ranks trained in one update
  over the update's time (the slowest rank's, median over updates).

What the CPU numbers say, and what they do not. On CPU, memory is the process's resident set
(`VmRSS`; the peak is `VmHWM`, reset through /proc/self/clear_refs after the warm-up so the
build's peak does not mask the updates'; `ru_maxrss`, which includes it, where that is refused).
RSS is an upper bound on live tensors: glibc keeps freed small blocks, and forked processes
count pages shared with the forkserver. The exact accounting is the number to compare between
settings (FSDP at N ranks holds ~1/N of DDP's); it leaves out DDP's gradient buckets (another
copy of the gradients, 4 B a parameter) and FSDP's transient gathers, which RSS sees. CPU times
say nothing about GPU throughput: gloo over loopback is not NCCL, there are no tensor cores and
no overlap of communication with compute, and bf16 on CPU is fast only with AMX/AVX512-BF16; on
a shared machine they also carry the other processes' load. On GPU (`--device cuda`, NCCL, one
GPU per rank) memory is `torch.cuda.memory_allocated` / `max_memory_allocated` (live tensors,
no allocator cache; `max_memory_reserved` is reported beside it), which is what decides whether
a model fits.

    python benchmarks/learner_memory_bench.py --quick                  # CPU, 2 gloo ranks
    python benchmarks/learner_memory_bench.py --device cuda            # >= 2 GPUs, NCCL
    python benchmarks/learner_memory_bench.py --device cuda --world 1  # one GPU, all at 1 rank

Reading the table: every rank runs the step's no-grad scoring pass (pi_old, entropy) on the
whole step batch, not on its share, in micro-batches of `micro_batch_tokens` when it is set;
`logprob_chunk_tokens` bounds its [positions, V] float32 logits and log-softmax temporaries.
Under FSDP each update keeps the root unit (final norm and output head: with the input
embedding, its own unit here since the head is untied, most of a small-hidden, 32k-vocabulary
model) gathered from forward to backward, so the peak falls by less than the state does.

Against the planner: each setting's `plan^` is `harness plan`'s peak per rank for the same model,
batch and options (`harness.planning.memory.estimate`), and `plan/upd` its ratio to the measured
`update^` (the tests hold it to 0.8x-1.25x, `tests/harness/test_plan.py`). On CPU the workers run
with glibc's mmap threshold at 64 KiB (`MALLOC_MMAP_THRESHOLD_`, as those tests do), so a freed
tensor leaves the resident set at once instead of staying in malloc's heap and inflating VmHWM.

Per phase (`benchmarks/memory_phases.py`): each setting also records the peak of the step's
scoring passes (pi_old), its minibatch updates' forwards and backwards, AdamW's steps and an MoE
policy's `moe/*` pass, beside the planner's scoring and update columns, so a ratio says which of
the planner's peaks is off. `--snapshot SETTING` (CUDA) runs one more update of that setting with
the allocator's trace on and prints what is alive at its peak, by allocation site. At one rank
FSDP2 skips the all-gather (the unsharded parameters are copied from the shards when needed), so
no prefetched block is alive there; at 2+ ranks its all-gather output is, and the plan counts
it. `--optimizer-impl` sets `learner.optimizer_impl` for every setting (`auto`: fused on cuda).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, get_args

import numpy as np
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.learner_bench import build_model
from benchmarks.memory_phases import live_at_peak, phase_peaks
from buffer.collate import RolloutBatch, collate
from buffer.rollout_group import RolloutGroup
from harness.planning.architecture import ModelShape, load_shape
from harness.planning.memory import estimate
from harness.planning.setup import LearnerSetup
from learner.config import LearnerConfig, make_arm
from learner.runtime.distributed import DistContext, barrier, init_distributed, shutdown
from learner.runtime.models import build_step_models, wrap_ddp
from learner.runtime.step import Optimised, train_on_batch
from learner.vocabulary import OptimizerImpl

hf_logging.disable_progress_bar()  # no "Loading weights" bars from every rank of every setting
MB = 2**20
# Imported once by the forkserver, so each setting's fresh processes start without the import
# cost (about 12 s on a 2-core machine).
PRELOAD = [
    "__main__",
    "torch",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.qwen3_moe.modeling_qwen3_moe",
    "learner.runtime.models",
    "learner.runtime.step",
]


@dataclass(frozen=True)
class Setting:
    """One column of the comparison: how many ranks, and the LearnerConfig fields it sets."""

    name: str
    world: int
    options: dict[str, object] = field(default_factory=dict)


def settings(args: argparse.Namespace) -> list[Setting]:
    fsdp = {"parallel": "fsdp"}
    micro = {"micro_batch_tokens": args.micro_batch_tokens}
    ckpt = {"activation_checkpointing": True}
    chunk = {"logprob_chunk_tokens": args.logprob_chunk_tokens}
    bf16 = {"dtype": "bfloat16"}
    return [
        Setting("single", 1),
        Setting("ddp", args.world),
        Setting("fsdp", args.world, fsdp),
        Setting("fsdp_micro", args.world, fsdp | micro),
        Setting("fsdp_ckpt", args.world, fsdp | ckpt),
        Setting("fsdp_all", args.world, fsdp | micro | ckpt | chunk),
        Setting("fsdp_bf16", args.world, fsdp | bf16),
        Setting("fsdp_micro_bf16", args.world, fsdp | micro | bf16),
        Setting("fsdp_all_bf16", args.world, fsdp | micro | ckpt | chunk | bf16),
    ]


def save_model(args: argparse.Namespace, directory: Path) -> int:
    """learner_bench's random-init Qwen2 (untied head) in `directory`, or `--model-config`'s
    model at `--layers` layers (initialised on `--device`, saved in bfloat16: the learner
    loads float32 master weights either way); its parameters."""
    positions = args.prompt_len + args.response_len
    if args.model_config is None:
        model = build_model(args, positions)
    else:
        fields = args.model_fields | {
            "num_hidden_layers": args.layers,
            "max_position_embeddings": positions,
        }
        fields.pop("torch_dtype", None)
        config = AutoConfig.for_model(**fields)
        torch.manual_seed(0)
        with torch.device(args.device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    params = sum(p.numel() for p in model.parameters())
    del model
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return params


def rollout_batch(args: argparse.Namespace) -> RolloutBatch:
    """`--groups` groups of `--group-size` responses of ragged length (a quarter to all of
    `--response-len` tokens) after a `--prompt-len` prompt; behaviour log-probs near a
    random-init model's (-log V), so the truncated IS weights stay near 1."""
    rng = np.random.default_rng(0)
    near_uniform = -math.log(args.vocab)
    groups = []
    for g in range(args.groups):
        lengths = rng.integers(args.response_len // 4, args.response_len + 1, args.group_size)
        groups.append(
            RolloutGroup(
                run_id="bench",
                group_id=f"g{g}",
                prompt_index=g,
                prompt_ids=rng.integers(3, args.vocab, args.prompt_len).tolist(),
                response_ids=[rng.integers(3, args.vocab, n).tolist() for n in lengths],
                behavior_logprobs=[(near_uniform - 0.1 * rng.random(n)).tolist() for n in lengths],
                rewards=rng.integers(0, 2, args.group_size).astype(float).tolist(),
                reward_infos=["{}"] * args.group_size,
                finish_reasons=["stop"] * args.group_size,
                policy_version=0,
                generator_id="bench",
                created_at=datetime.now(UTC),
            )
        )
    return collate(groups, pad_id=0)


class Memory(Protocol):
    """A rank's memory in bytes: now, and the peak since the last reset."""

    source: str

    def current(self) -> int: ...
    def reset_peak(self) -> None: ...
    def peak(self) -> int: ...


class HostMemory:
    """Resident set size (Linux /proc/self/status). The peak is VmHWM, reset by writing 5 to
    /proc/self/clear_refs; where that is refused, ru_maxrss (the process's peak since start)."""

    def __init__(self) -> None:
        self.source = "VmHWM"
        self.reset_peak()

    @staticmethod
    def _status_kib(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
        raise RuntimeError(f"/proc/self/status has no {key}; this benchmark reads Linux's RSS")

    def current(self) -> int:
        return self._status_kib("VmRSS") * 1024

    def reset_peak(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.source = "ru_maxrss"  # since the process started: includes the build's peak

    def peak(self) -> int:
        if self.source == "VmHWM":
            return self._status_kib("VmHWM") * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class CudaMemory:
    """Live tensor bytes on this rank's GPU (the caching allocator's reserve left out)."""

    source = "max_memory_allocated"

    def current(self) -> int:
        return torch.cuda.memory_allocated()

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated()


def local_bytes(tensor: torch.Tensor | None) -> int:
    """Bytes this rank holds of `tensor`: a DTensor's local shard, a plain tensor whole."""
    if tensor is None:
        return 0
    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    return tensor.numel() * tensor.element_size()


def state_bytes(opt: Optimised) -> dict[str, int]:
    """Parameters, gradients and AdamW state (exp_avg, exp_avg_sq, step) held by this rank."""
    params = list(opt.module.parameters())
    moments = [v for s in opt.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    counted = {
        "params_bytes": sum(local_bytes(p) for p in params),
        "grads_bytes": sum(local_bytes(p.grad) for p in params),
        "optimizer_bytes": sum(local_bytes(v) for v in moments),
    }
    return counted | {"state_bytes": sum(counted.values())}


@torch.no_grad()
def fault_in(module: torch.nn.Module) -> None:
    """Read every parameter once. transformers maps the weights file and the model's tensors
    view it without a copy, so their pages count in RSS only once read (the first forward
    would): without this, `after_build` leaves out an unsharded model's parameters."""
    for param in module.parameters():
        (param.to_local() if isinstance(param, DTensor) else param).sum()


def learner_config(setting: Setting, args: argparse.Namespace) -> LearnerConfig:
    """One minibatch, one epoch: one optimizer step per update, every row trained once."""
    return LearnerConfig(
        prompts_per_step=args.groups,
        lr=1e-6,
        old_logprobs="recompute",
        device=args.device,
        optimizer_impl=args.optimizer_impl,
        **setting.options,
    )


@dataclass(frozen=True)
class Job:
    """What every rank of one setting's processes is given."""

    setting: Setting
    args: argparse.Namespace
    port: int
    model_dir: Path
    out: Path


def measure(job: Job) -> dict:
    """This rank's memory, state bytes and update times for the job's setting."""
    cfg = learner_config(job.setting, job.args)
    dist = init_distributed(job.args.device, group_of_one=cfg.parallel == "fsdp")
    memory: Memory = CudaMemory() if job.args.device == "cuda" else HostMemory()
    try:
        return _updates(
            job.args, job.model_dir, cfg=cfg, dist=dist, memory=memory, name=job.setting.name
        )
    finally:
        shutdown(dist)  # after _updates returned: its DDP wrappers are freed first


def _updates(
    args: argparse.Namespace,
    model_dir: Path,
    *,
    cfg: LearnerConfig,
    dist: DistContext,
    memory: Memory,
    name: str,
) -> dict:
    arm = make_arm(name="gspo", objective="gspo")
    batch = rollout_batch(args)
    sync = torch.cuda.synchronize if args.device == "cuda" else lambda: None
    memory.reset_peak()
    before = memory.current()
    models = build_step_models(model_dir, arm, cfg, total_steps=args.updates + 1)
    models = wrap_ddp(models, dist)
    fault_in(models.policy.module)
    sync()
    after_build, build_peak = memory.current(), memory.peak()
    # The benchmark puts the batch on the device itself (the learner's loop trains the CPU batch
    # that `broadcast_batch` returns).
    batch = RolloutBatch(**{k: v.to(args.device) for k, v in vars(batch).items() if v is not None})
    seconds, phases = [], {}

    def update(version: int) -> None:
        train_on_batch(
            models, batch, arm=arm, learner=cfg, group_size=args.group_size,
            max_len=args.response_len, version=version, dist=dist,
        )  # fmt: skip

    for version in range(args.updates + 1):  # update 0 is the warm-up
        barrier(dist)
        sync()
        started = time.perf_counter()
        if version == 0:
            update(version)
        else:  # each phase's peak (the phases cover the update: their largest is its peak)
            with phase_peaks(memory, sync) as peaks:
                update(version)
            phases = {k: max(v, phases.get(k, 0)) for k, v in peaks.items()}
        sync()
        seconds.append(time.perf_counter() - started)
    traced = None
    if args.snapshot == name and args.device == "cuda":  # after the timed updates
        traced = live_at_peak(lambda: update(args.updates + 1))
    rows = batch.attention_mask.reshape(dist.world_size, -1, batch.attention_mask.shape[1])
    result = {
        "rank": dist.rank,
        "memory_source": memory.source,
        "before_build": before,
        "after_build": after_build,
        "build_peak": build_peak,
        "update_peak": max(phases.values()),
        "phase_peaks": phases,
        "update_s": seconds[1:],
        "trained_tokens": int(rows[dist.rank].sum()),  # this rank's share, real tokens only
        **state_bytes(models.policy),
    }
    if args.device == "cuda":
        result["update_peak_reserved"] = torch.cuda.max_memory_reserved()
    if traced is not None:
        result["live_at_peak"] = traced
    return result


def _worker(rank: int, job: Job) -> None:
    os.environ |= {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(job.port),
        "WORLD_SIZE": str(job.setting.world),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
    }
    torch.set_num_threads(job.args.threads)
    result = measure(job)
    (job.out / f"{job.setting.name}.{rank}.json").write_text(json.dumps(result))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_setting(setting: Setting, args: argparse.Namespace, model_dir: Path, out: Path) -> dict:
    """Fresh processes for one setting; the ranks' records combined."""
    mp.start_processes(
        _worker,
        args=(Job(setting, args, _free_port(), model_dir, out),),
        nprocs=setting.world,
        join=True,
        start_method="forkserver",
    )
    ranks = [
        json.loads((out / f"{setting.name}.{r}.json").read_text()) for r in range(setting.world)
    ]
    return combine(ranks)


def combine(ranks: list[dict]) -> dict:
    """Per-rank figures (lists, rank order) and the max over ranks of each memory figure;
    an update takes as long as its slowest rank."""
    each = [max(times) for times in zip(*(r["update_s"] for r in ranks), strict=True)]
    step_s = statistics.median(each)
    tokens = sum(r["trained_tokens"] for r in ranks)
    out: dict[str, object] = {
        "world": len(ranks),
        "memory_source": ranks[0]["memory_source"],
        "update_s": round(step_s, 4),
        "update_s_each": [round(t, 4) for t in each],
        "tokens_per_update": tokens,
        "tokens_per_s": round(tokens / step_s, 1),
    }
    deltas = {
        "build_increase": [r["after_build"] - r["before_build"] for r in ranks],
        "build_peak_increase": [r["build_peak"] - r["before_build"] for r in ranks],
        "update_peak_increase": [r["update_peak"] - r["before_build"] for r in ranks],
    }
    keys = ["before_build", "after_build", "build_peak", "update_peak"]
    keys += ["params_bytes", "grads_bytes", "optimizer_bytes", "state_bytes"]
    keys += ["update_peak_reserved"] if "update_peak_reserved" in ranks[0] else []
    for key in keys:
        deltas[key] = [r[key] for r in ranks]
    for key, values in deltas.items():
        out[key] = max(values)
        out[f"{key}_per_rank"] = values
    phases = {k for r in ranks for k in r["phase_peaks"]}
    out["phase_peaks"] = {k: max(r["phase_peaks"].get(k, 0) for r in ranks) for k in phases}
    if "live_at_peak" in ranks[0]:
        out["live_at_peak"] = ranks[0]["live_at_peak"]  # rank 0's
    return out


RATIO_KEYS = ("update_peak_increase", "state_bytes", "params_bytes", "grads_bytes")
RATIO_KEYS += ("optimizer_bytes", "tokens_per_s")


def ratios_vs(results: dict[str, dict], base: str) -> dict[str, dict[str, float | None]]:
    """Each setting's figure over the `base` setting's (max over ranks for memory)."""
    ref = results[base]
    return {
        name: {key: round(r[key] / ref[key], 3) if ref[key] else None for key in RATIO_KEYS}
        for name, r in results.items()
    }


def planned(shape: ModelShape, setting: Setting, args: argparse.Namespace, width: int) -> dict:
    """`harness plan`'s bytes per rank for the setting: the same model, batch (padded to
    `width`) and learner options (GSPO: no critic, no reference; plain sampling): its peak,
    its update and scoring columns and which pass the scoring column is."""
    cfg = learner_config(setting, args)
    setup = LearnerSetup(
        gpus=setting.world,
        parallel=cfg.parallel,
        dtype=cfg.dtype,
        activation_checkpointing=cfg.activation_checkpointing,
        groups=args.groups,
        group_size=args.group_size,
        minibatches=cfg.minibatches,
        seq_len=width,
        micro_batch_tokens=cfg.micro_batch_tokens,
        logprob_chunk_tokens=cfg.logprob_chunk_tokens,
        optimizer_impl=cfg.resolved_optimizer_impl,
    )
    plan = estimate(shape, setup)
    return {
        "planned_peak": int(plan.peak),
        "planned_update": int(plan.update.total),
        "planned_scoring": int(plan.scoring.total),
        "planned_scoring_pass": plan.scoring_pass,
        "planned_update_moment": plan.update_moment,
    }


HEADER = ("setting", "ranks", "rss0", "build+", "build^", "update^", "upd/ddp", "plan^")
HEADER += ("plan/upd", "state", "params", "grads", "adamw", "st/ddp", "update s", "tok/s")
HEADER += ("tok/ddp",)


def _cells(name: str, r: dict, q: dict) -> list[str]:
    """One table row: MiB figures, ratios to the base setting, time and throughput."""
    mib = ["before_build", "build_increase", "build_peak_increase", "update_peak_increase"]
    state = ["state_bytes", "params_bytes", "grads_bytes", "optimizer_bytes"]

    def ratio(key: str) -> str:
        return "-" if q[key] is None else f"{q[key]:.2f}"

    return [
        name,
        str(r["world"]),
        *(f"{r[k] / MB:.0f}" for k in mib),
        ratio("update_peak_increase"),
        f"{r['planned_peak'] / MB:.0f}",
        f"{r['planned_over_measured']:.2f}",
        *(f"{r[k] / MB:.0f}" for k in state),
        ratio("state_bytes"),
        f"{r['update_s']:.2f}",
        f"{r['tokens_per_s']:.0f}",
        ratio("tokens_per_s"),
    ]


def print_phases(name: str, r: dict) -> None:
    """One line: each phase's measured peak beside the planner's columns (MiB)."""
    measured = "  ".join(f"{k} {v / MB:.0f}" for k, v in sorted(r["phase_peaks"].items()))
    print(
        f"  {name} phases (MiB, measured): {measured}; planned: update "
        f"({r['planned_update_moment']}) {r['planned_update'] / MB:.0f}, "
        f"scoring ({r['planned_scoring_pass']}) {r['planned_scoring'] / MB:.0f}",
        flush=True,
    )
    if "live_at_peak" in r:
        print(f"  {name} live at the traced update's peak: {json.dumps(r['live_at_peak'])}")


def print_table(results: dict[str, dict], ratios: dict[str, dict], base: str) -> None:
    """One row per setting; memory in MiB per rank, max over ranks."""
    rows = [list(HEADER)] + [_cells(name, r, ratios[name]) for name, r in results.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    for row in rows:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    source = next(iter(results.values()))["memory_source"]
    print(
        f"MiB per rank (max over ranks). rss0: memory before the build; build+: after build + "
        f"shard minus rss0; build^ / update^: peak while building / during the timed updates "
        f"minus rss0 ({source}); plan^: harness plan's peak, plan/upd: plan^ / update^; state = "
        f"params + grads + adamw held by the rank (exact, local shards); */ddp: ratio to the "
        f"{base} row."
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--world", type=int, default=2, help="ranks of every setting but single")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (CPU)")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument(
        "--layers", type=int, default=6, help="decoder layers (also of --model-config)"
    )
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--groups", type=int, default=8, help="prompts per update")
    parser.add_argument("--group-size", type=int, default=4, help="responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=384, help="longest response")
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--logprob-chunk-tokens", type=int, default=512)
    parser.add_argument("--updates", type=int, default=3, help="timed updates (after 1 warm-up)")
    parser.add_argument("--only", nargs="+", default=None, help="run these settings only")
    parser.add_argument("--quick", action="store_true", help="smaller model and batch (CPU)")
    parser.add_argument(
        "--model-config", type=Path, default=None,
        help="a config.json to build at random init instead of the Qwen2 (--hidden and --vocab "
        "then come from it)",
    )  # fmt: skip
    parser.add_argument(
        "--optimizer-impl", default="auto", choices=get_args(OptimizerImpl),
        help="learner.optimizer_impl of every setting",
    )  # fmt: skip
    parser.add_argument(
        "--snapshot", default=None, metavar="SETTING",
        help="CUDA: one more update of SETTING with the allocator's trace on; what is alive at "
        "its peak, by allocation site",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.groups = 384, 4, 4
        args.prompt_len, args.response_len = 16, 64
        args.micro_batch_tokens, args.logprob_chunk_tokens = 256, 128
    args.model_fields = None
    if args.model_config is not None:
        args.model_fields = json.loads(args.model_config.read_text())
        args.hidden, args.vocab = args.model_fields["hidden_size"], args.model_fields["vocab_size"]
    return args


def check_devices(args: argparse.Namespace) -> None:
    if args.groups % args.world:
        sys.exit(f"learner_memory_bench: --groups {args.groups} must be a multiple of --world")
    if args.device != "cuda":
        return
    if not torch.cuda.is_available():
        sys.exit("learner_memory_bench: --device cuda but torch sees no CUDA device")
    if torch.cuda.device_count() < args.world:
        sys.exit(
            f"learner_memory_bench: --world {args.world} needs {args.world} GPUs (one a rank), "
            f"torch sees {torch.cuda.device_count()}; pass --world 1 to run every setting at 1 rank"
        )


MMAP_THRESHOLD = "65536"
"""glibc's mmap threshold of the CPU workers (module docstring), read as the forkserver starts."""


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse(argv)
    check_devices(args)
    chosen = [s for s in settings(args) if args.only is None or s.name in args.only]
    if args.device == "cpu":
        os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD)
    multiprocessing.set_forkserver_preload(PRELOAD)
    results: dict[str, dict] = {}
    batch = rollout_batch(args)
    width = int(batch.input_ids.shape[1])
    with tempfile.TemporaryDirectory(prefix="learner_memory_bench_") as tmp:
        model_dir, out = Path(tmp) / "model", Path(tmp)
        params = save_model(args, model_dir)
        shape = load_shape(model_dir)
        for setting in chosen:
            started = time.perf_counter()
            result = run_setting(setting, args, model_dir, out)
            plan = planned(shape, setting, args, width)
            ratio = round(plan["planned_peak"] / result["update_peak_increase"], 3)
            results[setting.name] = result | plan | {"planned_over_measured": ratio}
            print_phases(setting.name, results[setting.name])
            print(f"{setting.name}: {time.perf_counter() - started:.1f} s", flush=True)
    base = "ddp" if "ddp" in results else next(iter(results))
    ratios = ratios_vs(results, base)
    print_table(results, ratios, base)
    summary = {
        "benchmark": "learner_memory_bench",
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "world": args.world,
        "threads_per_rank": args.threads,
        "params": params,
        "rows": batch.batch_size,
        "width": batch.input_ids.shape[1],
        "real_tokens": int(batch.attention_mask.sum()),
        "settings": results,
        f"ratios_vs_{base}": ratios,
    }
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
