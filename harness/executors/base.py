"""What both executors share: the Protocols the driver and the supervisor program against.

An executor decides where a trial's processes live: `local` runs each trial as a subprocess of
`harness run` and its learner and generators as subprocesses of the trial's supervisor; `ray`
keeps the trial subprocesses but runs the components as Ray actors in one placement group per
trial. The driver asks an executor for its `TrialPool`, the supervisor for a `ComponentLauncher`;
rule sets (restart budget, one-line errors, teardown order) stay with the driver and supervisor,
so nothing in them depends on the executor's kind.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from harness.launch.trials import CommandBuilder, PlannedTrial, PoolLimits, RunningTrial, TrialExit
from harness.launch.warm_slots import WarmSlots
from harness.signals import SignalLatch

# In a trial's failure reason: a component's Ray node (or its actor) died under it. The Ray
# executor starts such a trial again, resuming; other failures are final.
NODE_LOST = "node lost"


class TrialFailedError(RuntimeError):
    """The learner crashed or could not start; the trial is resumable with --resume."""


class Component(Protocol):
    """A supervised component process, wherever it runs (`launch.processes.Child`'s interface)."""

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


class TrialPool(Protocol):
    """The driver's trial processes: at most `max_parallel` at once, each a `harness trial`.

    `env` is every trial's environment (the pool adds to it; the driver adds the bucket's).
    `interrupted` is the signal that stopped the pool, if any. Entering opens the pool (joins
    Ray, say), leaving it stops every trial still running.
    """

    env: dict[str, str]
    running: dict[str, RunningTrial]
    interrupted: int | None

    def has_room(self) -> bool: ...

    def start(self, spec: PlannedTrial, resume: bool) -> RunningTrial: ...

    def wait_any(self, timeout_s: float) -> list[TrialExit]: ...

    def interrupt(self, signum: int) -> None: ...

    def close(self) -> list[TrialExit]: ...

    def __enter__(self) -> TrialPool: ...

    def __exit__(self, *exc: object) -> None: ...


class Executor(Protocol):
    """One executor (`executor.kind`), as `harness.executors.open_executor` returns it."""

    # Components keep private working copies of the trial directory (with output in a bucket,
    # each one pulls what it reads and pushes what it writes); otherwise they share the
    # supervisor's trial directory.
    private_components: bool

    def trial_pool(
        self, command: CommandBuilder, limits: PoolLimits, warm: WarmSlots | None = None
    ) -> TrialPool:
        """The driver's pool of trial processes, not yet entered; `warm`: the slots of warm
        component processes its trials use (`executor.warm_components`)."""
        ...

    def components(
        self, num_generators: int, interrupted: SignalLatch
    ) -> AbstractContextManager[ComponentLauncher]:
        """The supervisor's launcher, open for the duration of one trial.

        Entered before the supervisor installs its signal handlers: connecting to Ray installs
        Ray's own SIGTERM handler, which must not replace the supervisor's.
        """
        ...

    def abandoned(self) -> bool:
        """This process gave up on the executor's teardown: exit with os._exit, skipping exit
        hooks that would wait for it."""
        ...
