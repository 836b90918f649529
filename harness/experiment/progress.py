"""Live progress of an experiment: one bar for the whole grid, one line per running trial.

Trial processes report nothing to the harness directly; their progress is read from the
metrics parts they write (`metrics.parquet/`, one part per learner step, renamed into place
whole; `contract.step_tables` owns the format). Each poll lists the steps on disk and reads only
parts not seen before, so watching a long trial costs one small file read per new step.
"""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from contract import metrics as M
from contract import step_tables
from contract.layout import TrialPaths
from contract.trial import LaunchStatus
from harness.launch.trials import PlannedTrial

WATCHED = (M.REWARD_MEAN, M.EVAL_PASS_RATE)
STATUS_STYLE = {
    LaunchStatus.COMPLETED: "green",
    LaunchStatus.DIVERGED: "yellow",
    LaunchStatus.FAILED: "red",
    LaunchStatus.INTERRUPTED: "red",
}


class MetricsTail:
    """Latest step and latest non-NaN watched metrics of one trial, read incrementally."""

    def __init__(self, trial_dir: Path) -> None:
        self.root = TrialPaths(Path(trial_dir)).metrics
        self._reset()

    def _reset(self) -> None:
        self._seen: set[int] = set()
        self.steps: set[int] = set()
        self.latest: dict[str, float] = {}
        self._latest_step: dict[str, int] = {}

    @property
    def steps_done(self) -> int:
        """Learner steps completed: rows are numbered by policy version, and row 0 holds only
        the initial eval, so the highest step on disk is the number of steps trained."""
        return max(self.steps, default=0)

    def poll(self) -> None:
        """Read parts that appeared since the last poll.

        If parts disappeared (a resumed learner dropped steps newer than its checkpoint),
        start over so the shown values match the disk.
        """
        on_disk = set(step_tables.part_steps(self.root))
        if not self._seen <= on_disk:
            self._reset()
        for step in sorted(on_disk - self._seen):
            try:
                table = step_tables.read_part(self.root, step)
            except (OSError, pa.ArrowException):
                continue  # vanished or unreadable right now; retried on the next poll
            self._seen.add(step)
            self._absorb(table)

    def _absorb(self, table: pa.Table) -> None:
        if M.STEP not in table.column_names:
            return
        steps = table.column(M.STEP).to_pylist()
        self.steps.update(int(step) for step in steps if step is not None)
        for metric in WATCHED:
            if metric not in table.column_names:
                continue
            for step, value in zip(steps, table.column(metric).to_pylist(), strict=True):
                if step is None or value is None or math.isnan(value):
                    continue
                if step >= self._latest_step.get(metric, -1):
                    self._latest_step[metric] = int(step)
                    self.latest[metric] = float(value)

    def summary(self) -> str:
        """`reward 0.41  pass 0.28` (dashes until a value exists)."""
        reward = self.latest.get(M.REWARD_MEAN)
        passed = self.latest.get(M.EVAL_PASS_RATE)
        shown_reward = "-" if reward is None else f"{reward:.3f}"
        shown_pass = "-" if passed is None else f"{passed:.3f}"
        return f"reward {shown_reward}  pass {shown_pass}"


class ExperimentProgress:
    """Rich display: the experiment bar (in learner steps, with ETA) and a bar per trial.

    The experiment bar counts steps rather than trials so its ETA moves during long trials.
    Trials that were already done when the launch began count as finished work from the start
    and do not inflate the speed estimate.
    """

    def __init__(
        self, console: Console, total_trials: int, done_trials: int, steps_per_trial: int
    ) -> None:
        self.console = console
        self.total_trials = total_trials
        self.finished_trials = done_trials
        self.steps_per_trial = steps_per_trial
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            speed_estimate_period=600.0,
        )
        self._experiment = self._progress.add_task(
            self._title(),
            total=total_trials * steps_per_trial,
            completed=done_trials * steps_per_trial,
            info="",
        )
        self._trials: dict[str, tuple[TaskID, MetricsTail]] = {}

    def __enter__(self) -> ExperimentProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def _title(self) -> str:
        return f"experiment {self.finished_trials}/{self.total_trials} trials"

    def trial_started(self, spec: PlannedTrial, resume: bool) -> None:
        tail = MetricsTail(spec.trial_dir)
        tail.poll()
        label = f"  {spec.trial_name}" + (" (resumed)" if resume else "")
        task = self._progress.add_task(
            label, total=self.steps_per_trial, completed=tail.steps_done, info=tail.summary()
        )
        self._trials[spec.trial_name] = (task, tail)

    def trial_finished(self, spec: PlannedTrial, status: str, message: str) -> None:
        """Drop the trial's line, count it done, and print a permanent line about it."""
        entry = self._trials.pop(spec.trial_name, None)
        summary = ""
        if entry is not None:
            task, tail = entry
            tail.poll()
            summary = f" ({tail.steps_done} steps, {tail.summary()})"
            self._progress.remove_task(task)
        self.finished_trials += 1
        style = STATUS_STYLE.get(status, "white")
        self.console.print(
            f"[{style}]{status}[/] {spec.trial_name}{summary}: {message}", highlight=False
        )
        self.refresh()

    def refresh(self) -> None:
        """Poll every running trial's metrics and update the bars."""
        running_steps = 0
        for task, tail in self._trials.values():
            tail.poll()
            done = min(tail.steps_done, self.steps_per_trial)
            running_steps += done
            self._progress.update(task, completed=done, info=tail.summary())
        completed = self.finished_trials * self.steps_per_trial + running_steps
        self._progress.update(self._experiment, completed=completed, description=self._title())
