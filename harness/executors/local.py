"""The `local` executor: trials are subprocesses of `harness run`, components of the trial."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from harness.executors.base import TrialPool
from harness.launch.pool import SubprocessTrialPool
from harness.launch.processes import Child
from harness.launch.trials import CommandBuilder, PoolLimits
from harness.signals import SignalLatch

LOOPBACK = "127.0.0.1"


class LocalLauncher:
    """Components as child processes of the supervisor; Redis on loopback."""

    redis_host = LOOPBACK

    def child(self, name: str, args: list[str], log_path: Path, env: dict[str, str]) -> Child:
        return Child(name, args, log_path, env)


class LocalExecutor:
    """Everything on this machine, sharing one trial directory."""

    private_components = False

    def trial_pool(self, command: CommandBuilder, limits: PoolLimits) -> TrialPool:
        return SubprocessTrialPool(command, limits)

    @contextlib.contextmanager
    def components(self, num_generators: int, interrupted: SignalLatch) -> Iterator[LocalLauncher]:
        del num_generators, interrupted  # a child process needs no reservation
        yield LocalLauncher()

    def abandoned(self) -> bool:
        return False
