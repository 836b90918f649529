"""A trial's identity, its staleness mode and its statuses (shared by runner, experiment, learner,
analysis).

Where its files live is `contract.layout`; the `trial.json` record is `contract.record`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal, get_args

# How the learner admits groups (design section 5); buffer, learner and harness share this type.
StalenessMode = Literal["fixed", "bounded"]
STALENESS_MODES: Final[tuple[StalenessMode, ...]] = get_args(StalenessMode)


@dataclass(frozen=True)
class TrialSpec:
    """One cell of the grid: (arm, seed, lag, mode)."""

    arm: str
    seed: int
    lag: int
    mode: StalenessMode

    @property
    def name(self) -> str:
        """`gspo__seed0__lag2__fixed`: sortable, unique within an experiment, safe in paths."""
        return f"{self.arm}__seed{self.seed}__lag{self.lag}__{self.mode}"


class TrialStatus(StrEnum):
    """`status` in trial.json, written by the trial runner (the learner reports the last two).

    A StrEnum, so a status is written to JSON and compared as its plain string value.
    """

    RUNNING = "running"  # started; still `running` after the process is gone: it was killed
    COMPLETED = "completed"  # trained every planned step
    DIVERGED = "diverged"  # stopped on a non-finite loss or gradient (design section 9)
    FAILED = "failed"  # a component crashed or the runner was interrupted; resumable


# A divergence is a result, not a crash, so it is final like `completed`: `harness run` skips
# these trials. The others are resumed from their last checkpoint.
TERMINAL_STATUSES: Final = frozenset({TrialStatus.COMPLETED, TrialStatus.DIVERGED})
RESUMABLE_STATUSES: Final = frozenset({TrialStatus.RUNNING, TrialStatus.FAILED})


class LaunchStatus(StrEnum):
    """How a trial ended in one `harness run` launch: the MLflow child run's `status` tag.

    The terminal trial statuses, plus what only the experiment sees: a trial that failed (also
    a trial process that exited without a terminal trial.json), one stopped by a signal, and
    one never started because the launch was interrupted first.
    """

    COMPLETED = "completed"
    DIVERGED = "diverged"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    NOT_STARTED = "not_started"
