"""Where a learner step's memory peaks: the peak of each phase of `train_on_batch`, and (CUDA)
what is alive at the update's peak, by the code that allocated it.

`harness plan` estimates two peaks, the no-grad scoring passes and the update, and checks them
against a measured step. The step's overall peak alone cannot say which phase it is, nor which
of the planner's parts (gathered units, saved activations, logits, routing) were alive at that
moment, which is what a planner that adds each part at its own peak gets wrong. So:

- `phase_peaks` patches the step's phases (pi_old and the other scoring passes,
  `step._score`; the minibatch updates' forwards and backwards, `step._train`, and within them
  every optimizer's step, through torch.optim's global step hooks; an MoE policy's `moe/*`
  routing pass, `StepRouting.metrics`),
  resetting the memory's peak as each starts and reading it as it ends; a phase's peak is its
  own, without the phases nested in it (`train` is the forwards and backwards, without the
  optimizer's steps): the moments `harness plan` estimates one by one;
- `live_at_peak` (CUDA only) reads the caching allocator's trace of one update's `train`
  phase (`torch.cuda.memory._record_memory_history`), replays it to find the moment the live
  bytes peak, before the first optimizer step and over the whole phase, and sums the blocks
  alive then by allocation site: the innermost frame in this repository, in transformers'
  modeling code, in FSDP or in torch.optim, whichever comes first. The trace sees only what
  was allocated after recording started, so the state allocated before (parameters,
  gradients, AdamW) is the `baseline`.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from learner.runtime import step
from learner.runtime.moe.routing import StepRouting

REPO = Path(__file__).resolve().parents[1]
PHASES = {"score": (step, "_score"), "train": (step, "_train")}
PHASES["moe_metrics"] = (StepRouting, "metrics")
OPTIMIZER = "optimizer"
"""Every optimizer's `step` (inside `train`), seen through torch.optim's global step hooks (an
LR scheduler wraps the instance's `step`, so patching the class would miss it)."""
OPTIMIZER_FILES = "/torch/optim/"
SITE_MARKERS = (str(REPO), "/transformers/models/", "/fsdp/", OPTIMIZER_FILES)
"""A frame whose file contains one of these names the allocation site (the first match, from
the innermost frame out); a block with none is counted under its innermost frame."""


class PeakMemory(Protocol):
    def reset_peak(self) -> None: ...
    def peak(self) -> int: ...


@contextlib.contextmanager
def phase_peaks(memory: PeakMemory, sync: Callable[[], None]) -> Iterator[dict[str, int]]:
    """Yield a dict that, while the context is open, collects each phase's own peak bytes (the
    largest over calls; module docstring): the phases' functions are wrapped, and restored on
    exit."""
    peaks: dict[str, int] = {}
    open_phases: list[str] = []
    originals = {name: getattr(owner, attr) for name, (owner, attr) in PHASES.items()}

    def close_segment() -> None:  # the innermost open phase's peak so far, then a fresh peak
        sync()
        if open_phases:
            name = open_phases[-1]
            peaks[name] = max(peaks.get(name, 0), memory.peak())
        memory.reset_peak()

    def enter(name: str) -> None:
        close_segment()
        open_phases.append(name)

    def leave() -> None:
        close_segment()
        open_phases.pop()

    def wrapped(name: str, fn: Callable) -> Callable:
        def run(*args, **kwargs):
            enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                leave()

        return run

    hooks = [
        register_optimizer_step_pre_hook(lambda *_: enter(OPTIMIZER)),
        register_optimizer_step_post_hook(lambda *_: leave()),
    ]
    try:
        for name, (owner, attr) in PHASES.items():
            setattr(owner, attr, wrapped(name, originals[name]))
        yield peaks
    finally:
        for name, (owner, attr) in PHASES.items():
            setattr(owner, attr, originals[name])
        for hook in hooks:
            hook.remove()


def site_of(frames: list[dict]) -> str:
    """`file:line function` of the allocation's site (module docstring), the file relative to
    the repository or shortened to its package path."""
    chosen = next(
        (f for f in frames if any(marker in f["filename"] for marker in SITE_MARKERS)),
        frames[0] if frames else None,
    )
    if chosen is None:
        return "?"  # no Python frame: made by autograd's engine in backward
    name = chosen["filename"]
    for root in (str(REPO) + "/", "site-packages/"):
        if root in name:
            name = name.split(root, 1)[1]
    site = f"{name}:{chosen['line']} {chosen['name']}"
    if "/fsdp/" in chosen["filename"]:  # FSDP allocates every buffer in one place: say for what
        start = frames.index(chosen)
        callers = [f["name"] for f in frames[start + 1 : start + 4] if "/fsdp/" in f["filename"]]
        site += "".join(f" < {caller}" for caller in callers)
    return site


def replay_peak(trace: list[dict]) -> tuple[int, int, dict[int, tuple[int, str]], int]:
    """(bytes above the trace's start at its peak, bytes of blocks older than the trace freed
    by then, the trace's blocks alive then: address -> (size, site), the peak's event index).
    A block counts from its `alloc` to its `free_completed` (a freed block that a stream still
    uses stays allocated until then); freeing a block older than the trace (the last update's
    gradients, say) lowers the total below the start."""
    live: dict[int, int] = {}
    total, best, best_at, freed_old, freed_old_at_best = 0, 0, -1, 0, 0
    for index, event in enumerate(trace):
        action = event["action"]
        if action == "alloc":
            live[event["addr"]] = event["size"]
            total += event["size"]
            if total > best:
                best, best_at, freed_old_at_best = total, index, freed_old
        elif action == "free_completed":
            size = live.pop(event["addr"], None)
            if size is None:
                size = event["size"]
                freed_old += size
            total -= size
    alive: dict[int, tuple[int, str]] = {}
    for event in trace[: best_at + 1]:
        if event["action"] == "alloc":
            alive[event["addr"]] = (event["size"], site_of(event.get("frames", [])))
        elif event["action"] == "free_completed":
            alive.pop(event["addr"], None)
    return best, freed_old_at_best, alive, best_at


def live_at_peak(run: Callable[[], None], phase: str = "train", top: int = 25) -> dict[str, object]:
    """Run `run` (one update) with the CUDA allocator's trace recorded through its `phase`
    (`PHASES`; the updates by default: the whole step's trace is several times longer and
    slow to read back); the baseline as the phase starts, the replayed peak above it, and the
    `top` allocation sites alive at the peak (MiB)."""
    owner, attr = PHASES[phase]
    original, traced = getattr(owner, attr), {}

    def recorded(*args, **kwargs):
        torch.cuda.synchronize()
        traced["baseline"] = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
        try:
            return original(*args, **kwargs)
        finally:
            torch.cuda.synchronize()
            traced["snapshot"] = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)

    setattr(owner, attr, recorded)
    try:
        run()
    finally:
        setattr(owner, attr, original)
    trace = traced["snapshot"]["device_traces"][torch.cuda.current_device()]
    first_step = next(
        (i for i, e in enumerate(trace) if e["action"] == "alloc" and _in_optimizer(e)), None
    )
    mib = 2**20
    found: dict[str, object] = {"phase": phase, "events": len(trace)}
    found["baseline_mib"] = round(traced["baseline"] / mib, 1)
    windows = {"before_optimizer": trace[:first_step], "whole": trace}
    for window, events in windows.items():
        above, freed_old, alive, at = replay_peak(events)
        by_site: Counter[str] = Counter()
        for size, site in alive.values():
            by_site[site] += size
        largest = sorted(alive.values(), reverse=True)[:top]
        found[window] = {
            "peak_above_baseline_mib": round(above / mib, 1),
            "baseline_freed_by_peak_mib": round(freed_old / mib, 1),
            "peak_event": [at, site_of(events[at].get("frames", [])) if at >= 0 else None],
            "sites_mib": {site: round(size / mib, 1) for site, size in by_site.most_common(top)},
            "largest_blocks_mib": [[round(size / mib, 1), site] for size, site in largest],
        }
    return found


def _in_optimizer(event: dict) -> bool:
    return any(OPTIMIZER_FILES in frame["filename"] for frame in event.get("frames", []))
