"""The `local` executor: trials are subprocesses of `harness run`, components of the trial."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from harness.config import ExperimentConfig
from harness.config.executor import CpuSets
from harness.executors.base import TrialPool
from harness.launch.affinity import check_cpu_sets, component_cpus
from harness.launch.forked_child import zygote_from_env
from harness.launch.pool import SubprocessTrialPool
from harness.launch.processes import Child
from harness.launch.trials import CommandBuilder, PoolLimits
from harness.launch.warm_child import WarmChild
from harness.launch.warm_protocol import warm_components_from_env
from harness.launch.warm_slots import WarmPlan, WarmSlots
from harness.signals import SignalLatch

LOOPBACK = "127.0.0.1"


class LocalLauncher:
    """Components as child processes of the supervisor, run by the warm processes `harness
    run` keeps for the trial's slot (WARM_COMPONENTS_ENV), or forked by the zygote `harness run`
    (or the test suite) keeps (ZYGOTE_ENV); Redis on loopback."""

    redis_host = LOOPBACK

    def __init__(self, cpus: dict[str, frozenset[int]] | None = None) -> None:
        self.warm = warm_components_from_env()
        self.zygote = zygote_from_env()
        # component name -> its CPU set (executor.cpu_sets, `affinity.component_cpus`)
        self.cpus = cpus or {}

    def child(self, name: str, args: list[str], log_path: Path, env: dict[str, str]) -> Child:
        cpus = self.cpus.get(name)
        path, pid = self.warm.get(name, (None, None))
        if path is None and self.zygote is None:
            return Child(name, args, log_path, env, cpus=cpus)
        # A learner under torchrun starts cold either way (`WarmChild._runs_harness_cli`).
        return WarmChild(
            name, args, log_path, env, cpus=cpus, socket_path=path, warm_pid=pid, zygote=self.zygote
        )


class LocalExecutor:
    """Everything on this machine, sharing one trial directory; with `cpu_sets`, each
    component pinned to its CPUs."""

    private_components = False

    def __init__(self, cpu_sets: CpuSets | None = None) -> None:
        self.cpu_sets = cpu_sets

    def trial_pool(
        self, command: CommandBuilder, limits: PoolLimits, warm: WarmSlots | None = None
    ) -> TrialPool:
        return SubprocessTrialPool(command, limits, warm=warm)

    @contextlib.contextmanager
    def components(self, num_generators: int, interrupted: SignalLatch) -> Iterator[LocalLauncher]:
        del interrupted  # a child process needs no reservation
        # Checked here, in the trial's supervisor, against the CPUs this machine lends it.
        yield LocalLauncher(component_cpus(self.cpu_sets, num_generators))

    def abandoned(self) -> bool:
        return False


def warm_plan(cfg: ExperimentConfig) -> WarmPlan | None:
    """The warm processes each slot of `harness run` keeps for `cfg`'s trials, and whether a
    zygote (`executor.fork_components`) forks them and every component start they do not serve
    (all of them with `executor.warm_components: false`); None for another executor. A learner
    under torchrun (several ranks) is not kept: torchrun starts its ranks itself. The zygote
    pays torch's and transformers' imports once for every warm process of every slot (a vLLM
    warm process still imports vLLM itself).

    Also where `harness run` refuses, before its first trial, CPU sets (`executor.cpu_sets`)
    this machine cannot honour, and warns of components with more threads than CPUs."""
    for warning in check_cpu_sets(cfg):
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    if cfg.executor.kind != "local":
        return None
    components: dict[str, tuple[str, ...]] = {}
    if cfg.executor.warm_components and cfg.executor.learner_ranks == 1:
        components["learner"] = ("learner",)
    if cfg.executor.warm_components:
        for index in range(cfg.generation.num_generators):
            components[f"generator-{index}"] = ("generator", cfg.generation.backend)
    return WarmPlan(components, zygote=cfg.executor.fork_components)
