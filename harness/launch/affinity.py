"""Pinning a trial's components to CPU sets (`executor.cpu_sets`, kind=local).

On a machine whose cores the learner and the generators share, "learner wait" and "generator
idle" measure CPU contention as much as the asynchrony under study. Pinning each component to
its own cores makes one machine model a disaggregated fleet (generators on their nodes, the
learner on its node), so those figures mean what they say.

Where the pinning happens: a cold component is pinned between fork and exec (`Child`'s
preexec), before it imports torch, and every thread it starts inherits the mask; a torchrun
learner's ranks inherit the agent's. A warm component process (`harness.cli_warm`) already runs
threads from earlier trials, so it pins each of its threads at every assignment
(`pin_all_threads`), and an assignment without CPU sets gets the mask it started with back.

What is checked where: the config checks the CPU lists, their disjointness and the executor
kind (`harness.config.sections.CpuSets`); the CPUs this machine lends the run and the number of
generator sets are checked here, when a run or a trial starts, because a config is also read
on other machines (a report) and by components already pinned to a subset of the CPUs.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from harness.config.executor import CpuSets
from harness.cpu_lists import format_cpu_list
from harness.overrides import ConfigError

if TYPE_CHECKING:
    from harness.config import ExperimentConfig

# The start of the line a pinned component's log gets (tests and readers look for it).
PINNED_LINE = "cpu affinity:"


def available_cpus() -> frozenset[int]:
    """The CPUs this process may run on (what the machine, container or taskset lends it)."""
    return frozenset(os.sched_getaffinity(0))


def component_cpus(cpu_sets: CpuSets | None, num_generators: int) -> dict[str, frozenset[int]]:
    """The CPUs of each component by its launcher name (`learner`, `generator-<i>`); empty when
    unset. Raises ConfigError in one line, naming the field, for a number of generator sets
    that fits neither one per generator nor one shared, or CPUs this process cannot use."""
    if cpu_sets is None:
        return {}
    try:
        generators = cpu_sets.generator_cpus(num_generators)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    missing = cpu_sets.all_cpus() - available_cpus()
    if missing:
        raise ConfigError(
            f"executor.cpu_sets names CPUs {format_cpu_list(missing)}, which this machine does "
            f"not lend the run (it may use CPUs {format_cpu_list(available_cpus())})"
        )
    cpus = {"learner": cpu_sets.learner_cpus()}
    cpus.update({f"generator-{i}": gen for i, gen in enumerate(generators)})
    return cpus


def thread_warnings(cfg: ExperimentConfig, arm: str | None = None) -> list[str]:
    """Components that run more threads than their CPU set has CPUs: they still run and give
    the same results (a thread count, not the mask, decides the arithmetic), but their threads
    then take turns on fewer cores, which the timings would show as a slower component.
    `arm`: that arm's learner settings only (a trial), else every arm's."""
    cpu_sets = cfg.executor.cpu_sets
    if cpu_sets is None:
        return []
    messages = []
    learner_cpus = len(cpu_sets.learner_cpus())
    arms = cfg.arms if arm is None else [cfg.arm(arm)]
    ranks = cfg.executor.learner_ranks
    for each in arms:
        threads = each.training_settings(cfg.learner).threads * ranks
        if threads > learner_cpus:
            messages.append(
                f"arm {each.name!r}: the learner runs {threads} threads "
                f"(learner.threads x executor.learner_ranks) on {learner_cpus} CPU(s) of "
                f"executor.cpu_sets.learner={cpu_sets.learner!r}; they will take turns"
            )
    threads = cfg.generation.threads
    generators = cpu_sets.generator_entries()
    sharing = cfg.generation.num_generators if len(generators) == 1 else 1
    for index, cpus in enumerate(generators):
        if threads * sharing > len(cpus):
            messages.append(
                f"executor.cpu_sets.generators[{index}]={cpu_sets.generators[index]!r} has "
                f"{len(cpus)} CPU(s) for {threads * sharing} generator threads "
                f"(generation.threads={threads} x {sharing} generator(s)); they will take turns"
            )
    return messages


def check_cpu_sets(cfg: ExperimentConfig) -> list[str]:
    """What a run checks before its first trial: ConfigError for CPU sets this machine cannot
    honour; returns the thread warnings (`thread_warnings`)."""
    component_cpus(cfg.executor.cpu_sets, cfg.generation.num_generators)
    return thread_warnings(cfg)


def thread_ids(pid: int) -> list[int]:
    """The ids of the threads of process `pid` (Linux /proc)."""
    try:
        return [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def pin_all_threads(cpus: frozenset[int]) -> None:
    """Set the CPU mask of every thread of this process (sched_setaffinity of a pid sets that
    one thread's; threads started later inherit their creator's). A thread that ends meanwhile
    is skipped."""
    for tid in thread_ids(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cpus)


def thread_cpus(pid: int) -> dict[int, frozenset[int]]:
    """Each live thread of `pid` with the CPUs it may run on (what the tests check)."""
    masks = {}
    for tid in thread_ids(pid):
        with contextlib.suppress(ProcessLookupError):
            masks[tid] = frozenset(os.sched_getaffinity(tid))
    return masks


def pinned_line(name: str, pid: int, cpus: frozenset[int]) -> str:
    """The log line that says component `name` (process `pid`) runs on `cpus`."""
    return f"{PINNED_LINE} {name} (pid {pid}) runs on CPUs {format_cpu_list(cpus)}"


__all__ = [
    "PINNED_LINE",
    "available_cpus",
    "check_cpu_sets",
    "component_cpus",
    "pin_all_threads",
    "pinned_line",
    "thread_cpus",
    "thread_warnings",
]
