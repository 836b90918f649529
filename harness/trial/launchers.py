"""Where a trial's components run: local child processes, or Ray actors (executor.kind).

The supervisor holds one rule set (restart budget, one-line errors, teardown order) and asks a
launcher for its components; a launcher only decides where each one's process lives. Both hand
back objects with `Child`'s interface (start, poll, stop, last_line, tail), so nothing in the
supervisor depends on the executor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from harness.config import ExperimentConfig
from harness.signals import SignalLatch
from harness.trial.processes import Child

LOOPBACK = "127.0.0.1"
# In a trial's failure reason: a component's Ray node (or its actor) died under it. The Ray
# executor starts such a trial again, resuming; other failures are final.
NODE_LOST = "node lost"


class Component(Protocol):
    """A supervised component process, wherever it runs."""

    name: str

    def start(self) -> None: ...

    def poll(self) -> int | None: ...

    def stop(self, timeout_s: float = 10.0) -> None: ...

    def last_line(self) -> str: ...

    def tail(self, lines: int = 20) -> str: ...


class ComponentLauncher(Protocol):
    """Makes the components of one trial. `redis_host`: the address its embedded Redis binds,
    one every component can reach."""

    redis_host: str

    def child(self, name: str, args: list[str], log_path: Path, env: dict[str, str]) -> Component:
        """The component `name` (`learner` or `generator-<i>`), not started yet."""
        ...


class LocalLauncher:
    """Components as child processes of the supervisor; Redis on loopback."""

    redis_host = LOOPBACK

    def child(self, name: str, args: list[str], log_path: Path, env: dict[str, str]) -> Child:
        return Child(name, args, log_path, env)


@contextlib.contextmanager
def open_launcher(cfg: ExperimentConfig, interrupted: SignalLatch) -> Iterator[ComponentLauncher]:
    """The launcher `cfg.executor.kind` asks for, open for the duration of the trial.

    Entered before the supervisor installs its signal handlers: connecting to Ray installs
    Ray's own SIGTERM handler, which must not replace the supervisor's.
    """
    if cfg.executor.kind == "local":
        yield LocalLauncher()
        return
    from harness.trial.ray_components import RayLauncher  # Ray is an optional extra

    with RayLauncher(cfg.executor, cfg.generation.num_generators, interrupted) as launcher:
        yield launcher
