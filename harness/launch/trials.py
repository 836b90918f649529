"""A trial as the launcher sees it: the planned cell, the command that runs it, how it ended.

Shared by the experiment (which plans trials and reads how they ended) and the executors (whose
pools start them): it sits below both and imports nothing of the harness.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from contract.layout import TRIAL_JSON, TrialPaths
from contract.record import TrialRecord
from contract.trial import TERMINAL_STATUSES, LaunchStatus, StalenessMode, TrialStatus


@dataclass(frozen=True)
class PlannedTrial:
    """One cell of the grid as the experiment plans it: the runner's `TrialSpec` fields plus the
    objective and the trial directory."""

    arm: str
    objective: str
    seed: int
    lag: int
    mode: StalenessMode
    trial_name: str
    trial_dir: Path

    @property
    def paths(self) -> TrialPaths:
        return TrialPaths(self.trial_dir)


# (spec, resume) -> argv. Injectable so tests can run a tiny real script in place of a trial.
CommandBuilder = Callable[[PlannedTrial, bool], list[str]]

DEFAULT_PREFIX = (sys.executable, "-m", "harness.cli")


@dataclass(frozen=True)
class PoolLimits:
    """What bounds a pool of trial processes, passed as one from `run_experiment` through the
    executor to the pool: trials at once, the seconds a stopped trial gets to tear down before
    SIGKILL, and the most seconds one trial may run (None: no limit)."""

    max_parallel: int
    kill_grace_s: float = 10.0
    trial_timeout_s: float | None = None


def trial_command(
    config_path: Path,
    overrides: Sequence[str] = (),
    steps: int | None = None,
    prefix: Sequence[str] = DEFAULT_PREFIX,
) -> CommandBuilder:
    """Builder of `<prefix> trial CONFIG --arm A --seed N --lag K --mode M --out DIR ...`.

    The config path is made absolute and the overrides are passed through unchanged, so every
    trial resolves exactly the config the experiment resolved.
    """
    config = str(Path(config_path).resolve())
    passed = list(overrides)

    def build(spec: PlannedTrial, resume: bool) -> list[str]:
        argv = [*prefix, "trial", config, "--arm", spec.arm, "--seed", str(spec.seed)]
        argv += ["--lag", str(spec.lag), "--mode", spec.mode, "--out", str(spec.trial_dir)]
        if steps is not None:
            argv += ["--steps", str(steps)]
        if resume:
            argv.append("--resume")
        return argv + passed

    return build


@dataclass
class RunningTrial:
    """A started trial process; its pid is also its process-group id."""

    spec: PlannedTrial
    resume: bool
    process: subprocess.Popen[bytes]
    started: float  # time.monotonic()
    tree: list[psutil.Process] | None = None  # descendants seen when it was interrupted
    slot: int | None = None  # its slot of warm component processes (`warm_slots`), if any
    left_processes: bool = False  # it exited leaving processes behind (killed since)


@dataclass(frozen=True)
class TrialExit:
    """How a trial process ended. `status`: completed|diverged|failed|interrupted."""

    spec: PlannedTrial
    resume: bool
    returncode: int | None
    status: LaunchStatus
    message: str
    duration_s: float


def exit_status(returncode: int, record: TrialRecord | None) -> tuple[LaunchStatus, str]:
    """(status, message) from the exit code and trial.json, per the trial-runner contract.

    Exit 0 means completed or diverged, and trial.json must agree; anything else is a failure,
    including an exit 0 whose trial.json says otherwise (the runner lost track of its state).
    """
    if returncode == 0 and record is not None and record.status in TERMINAL_STATUSES:
        if record.status == TrialStatus.DIVERGED:
            return LaunchStatus.DIVERGED, f"diverged: {record.diverged_reason}"
        return LaunchStatus.COMPLETED, "completed"
    if returncode == 0:
        status = None if record is None else record.status.value
        return LaunchStatus.FAILED, f"exited 0 but {TRIAL_JSON} says status {status!r}"
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
    return LaunchStatus.FAILED, how


__all__ = [
    "DEFAULT_PREFIX",
    "CommandBuilder",
    "PlannedTrial",
    "PoolLimits",
    "RunningTrial",
    "TrialExit",
    "exit_status",
    "trial_command",
]
