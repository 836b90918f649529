"""The `local` executor: trials are subprocesses of `harness run`, components of the trial."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from harness.experiment.scheduler import CommandBuilder, TrialPool
from harness.signals import SignalLatch
from harness.trial.processes import Child

LOOPBACK = "127.0.0.1"


class LocalLauncher:
    """Components as child processes of the supervisor; Redis on loopback."""

    redis_host = LOOPBACK

    def child(self, name: str, args: list[str], log_path: Path, env: dict[str, str]) -> Child:
        return Child(name, args, log_path, env)


class LocalExecutor:
    """Everything on this machine, sharing one trial directory."""

    private_components = False

    def trial_pool(
        self,
        command: CommandBuilder,
        max_parallel: int,
        kill_grace_s: float = 10.0,
        trial_timeout_s: float | None = None,
    ) -> TrialPool:
        return TrialPool(command, max_parallel, kill_grace_s, trial_timeout_s)

    @contextlib.contextmanager
    def components(self, num_generators: int, interrupted: SignalLatch) -> Iterator[LocalLauncher]:
        del num_generators, interrupted  # a child process needs no reservation
        yield LocalLauncher()

    def abandoned(self) -> bool:
        return False
