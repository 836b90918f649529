"""`harness run`: expand the grid, run its trials as subprocesses, track them, build the report.

The launch is an explicit loop: classify every trial from its directory (skip the finished,
resume the interrupted), start trials while there is room, reap the ones that exit and log each
to MLflow, refresh the progress display. Ctrl-C or SIGTERM stops every trial's process group
(trial.json stays `running`, so the next launch resumes it) and returns exit status 128+signal.
"""

from __future__ import annotations

import fcntl
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from contract.layout import ExperimentPaths
from contract.trial import LaunchStatus
from harness.config import ExperimentConfig, resolved_dump
from harness.executors import open_executor
from harness.executors.base import TrialPool
from harness.executors.local import warm_plan
from harness.experiment.grid import TrialOnDisk, classify_trials, expand_trials, experiment_dir
from harness.experiment.progress import ExperimentProgress
from harness.experiment.request import ExperimentRequest
from harness.experiment.software import launch_software_line
from harness.experiment.tracking import Tracker, open_tracker
from harness.launch.trials import (
    CommandBuilder,
    PlannedTrial,
    PoolLimits,
    TrialExit,
    trial_command,
)
from harness.launch.warm_slots import WarmSlots
from harness.signals import forward_signals
from harness.storage.experiment_storage import publish_working_copy
from harness.storage.remote_tree import StorageError
from harness.storage.setup import setup_driver_storage
from harness.storage.trial_storage import Storage

__all__ = [
    "ExperimentRequest",
    "ExperimentResult",
    "PlannedTrial",
    "TrialResult",
    "expand_trials",
    "run_experiment",
]

LOCK_FILE = ".harness.lock"
REPORT_DIR = "report"
WAIT_S = 0.5  # one loop turn: reap, then refresh the display


@dataclass(frozen=True)
class Stage:
    """One stage of a tuned experiment: its name (`tuning` or `final`) and the tracker whose
    parent run holds every stage's trials."""

    name: str
    tracker: Tracker


class ExperimentLockedError(RuntimeError):
    """Another `harness run` is using the same output directory."""


@dataclass(frozen=True)
class TrialResult:
    """What happened to one trial in this launch.

    `status`: completed | diverged | failed | interrupted (stopped by a signal) | not_started
    (the launch was interrupted first). `skipped`: finished in an earlier launch.
    """

    spec: PlannedTrial
    status: LaunchStatus
    message: str
    skipped: bool = False
    resumed: bool = False
    returncode: int | None = None
    duration_s: float | None = None  # from its start in this launch to its end (None: not run)


@dataclass
class ExperimentResult:
    """The outcome of `run_experiment`; `exit_code` is what `harness run` should exit with."""

    out_dir: Path
    trials: list[TrialResult] = field(default_factory=list)
    interrupted_by: int | None = None
    tracking_uri: str | None = None
    parent_run_id: str | None = None
    report_paths: dict[str, Path] = field(default_factory=dict)
    report_error: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[TrialResult]:
        return [t for t in self.trials if t.status == LaunchStatus.FAILED]

    @property
    def exit_code(self) -> int:
        """128+signal if interrupted, 1 if a trial failed or the report broke, else 0."""
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by
        return 1 if self.failed or self.report_error else 0


@contextmanager
def experiment_lock(out_dir: Path) -> Iterator[None]:
    """Hold `<out_dir>/.harness.lock` so two launches never run the same trials at once."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / LOCK_FILE).open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExperimentLockedError(
                f"another `harness run` is using {out_dir} (it holds {out_dir / LOCK_FILE}); "
                "wait for it to finish or set output_dir/name to another directory"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _track(
    console: Console, result: ExperimentResult, what: str, call: Callable[..., Any], *args: Any
) -> None:
    """Run a tracking call; on failure warn and go on. Trials matter more than their logging,
    and a re-launch logs whatever was missed, from the trial directories."""
    try:
        call(*args)
    except Exception as exc:  # any tracking failure must not stop the trials
        text = f"MLflow: could not {what}: {type(exc).__name__}: {exc}; re-run `harness run` "
        text += "on this output dir to log it again"
        result.warnings.append(text)
        console.print(f"[yellow]warning:[/] {text}", highlight=False)


def _plan(
    trials: list[TrialOnDisk], console: Console, result: ExperimentResult
) -> deque[TrialOnDisk]:
    """Queue of trials to run (grid order); done ones are recorded as skipped."""
    queue: deque[TrialOnDisk] = deque()
    for trial in trials:
        if trial.problem:
            text = f"{trial.spec.trial_name}: {trial.problem}"
            result.warnings.append(text)
            console.print(f"[yellow]warning:[/] {text}", highlight=False)
        if trial.state == "done":
            message = "finished in an earlier launch"
            status = LaunchStatus(trial.status)  # a terminal trial status: completed or diverged
            result.trials.append(TrialResult(trial.spec, status, message, skipped=True))
        else:
            queue.append(trial)
    return queue


def _record_exit(
    done: TrialExit,
    result: ExperimentResult,
    tracker: Tracker,
    progress: ExperimentProgress,
    console: Console,
) -> None:
    trial = TrialResult(
        done.spec, done.status, done.message, False, done.resume, done.returncode, done.duration_s
    )
    result.trials.append(trial)
    what = f"log trial {done.spec.trial_name}"
    _track(console, result, what, tracker.trial_ended, done.spec, done.status, done.message)
    progress.trial_finished(done.spec, done.status, done.message)
    if done.status == LaunchStatus.FAILED:
        console.print(f"  see {done.spec.paths.trial_log}", highlight=False)


def _run_queue(
    *,
    queue: deque[TrialOnDisk],
    pool: TrialPool,
    tracker: Tracker,
    progress: ExperimentProgress,
    console: Console,
    result: ExperimentResult,
) -> None:
    """The scheduling loop: fill free slots in grid order, reap exits, refresh the display.

    Stops early when a signal interrupts the pool; `pool.close()` then stops the rest, and
    the trials left in `queue` are the ones never started.
    """
    while (queue or pool.running) and pool.interrupted is None:
        while queue and pool.has_room():
            trial = queue.popleft()
            resume = trial.state == "resume"
            what = f"start the run of {trial.spec.trial_name}"
            _track(console, result, what, tracker.trial_started, trial.spec, resume)
            pool.start(trial.spec, resume)
            progress.trial_started(trial.spec, resume)
        for done in pool.wait_any(WAIT_S):
            _record_exit(done, result, tracker, progress, console)
        progress.refresh()
    for done in pool.close():
        _record_exit(done, result, tracker, progress, console)


def _adopt_finished(
    trials: list[TrialOnDisk],
    tracker: Tracker,
    console: Console,
    result: ExperimentResult,
) -> None:
    """Trials finished in an earlier launch join this launch's parent run (logged if never
    logged, e.g. when the previous launch was killed between a trial's end and its logging)."""
    for trial in trials:
        if trial.state == "done":
            what = f"log trial {trial.spec.trial_name}"
            _track(console, result, what, tracker.trial_done_before, trial)


def _finish_trials(
    trials: list[TrialOnDisk], queue: deque[TrialOnDisk], result: ExperimentResult
) -> None:
    """Record the never-started trials and put the results in grid order (not exit order)."""
    for trial in queue:
        not_started = TrialResult(trial.spec, LaunchStatus.NOT_STARTED, "launch interrupted")
        result.trials.append(not_started)
    order = {t.spec.trial_name: index for index, t in enumerate(trials)}
    result.trials.sort(key=lambda t: order[t.spec.trial_name])


def run_experiment(
    request: ExperimentRequest,
    *,
    console: Console | None = None,
    command: CommandBuilder | None = None,
    kill_grace_s: float = 10.0,
    trial_timeout_s: float | None = None,
    report: bool = True,
    stage: Stage | None = None,
) -> ExperimentResult:
    """Run (or resume) every trial of `request.cfg`, track it in MLflow and build the report.

    `command` replaces the trial command (tests run a tiny script with it). `stage`: one stage
    of a tuned experiment (harness.experiment.tuning), whose trials join the parent run of the
    caller's tracker instead of a parent of their own.
    """
    cfg, steps = request.cfg, request.steps
    console = console or Console()
    executor = open_executor(cfg.executor)
    # a bucket: run in this machine's working copy, synced with it
    storage, out_dir = setup_driver_storage(cfg, request.out_dir, executor)
    out_dir = Path(out_dir).resolve() if out_dir is not None else experiment_dir(cfg)
    parallel = request.max_parallel if request.max_parallel is not None else cfg.max_parallel
    # Warm component processes serve harness trials only, not a command a test put in place.
    plan = warm_plan(cfg) if command is None else None
    command = command or trial_command(request.config_path, request.overrides, steps)
    result = ExperimentResult(out_dir)
    with experiment_lock(out_dir), _published(storage, out_dir, console):
        resolved = yaml.safe_dump(resolved_dump(cfg), sort_keys=False)
        ExperimentPaths(out_dir).resolved_config.write_text(resolved)
        per_trial = steps if steps is not None else cfg.learner.steps
        specs = expand_trials(cfg, out_dir)
        trials = classify_trials(specs, cfg.config_hash(), per_trial)
        queue = _plan(trials, console, result)
        if software := launch_software_line(trials):
            result.warnings.append(software)
            console.print(f"[yellow]warning:[/] {software}", highlight=False)
        if stage is None:
            tracker = open_tracker(cfg, out_dir)  # fails fast on a bad store, before any trial
            tracker.start_experiment(request)
        else:
            tracker = stage.tracker
            tracker.begin_stage(cfg, stage.name)
        result.tracking_uri = getattr(tracker, "tracking_uri", None)
        result.parent_run_id = tracker.parent_run_id
        try:
            _adopt_finished(trials, tracker, console, result)
            console.print(
                f"{cfg.name}: {len(trials)} trials, {len(queue)} to run, "
                f"{len(trials) - len(queue)} already done; output in {out_dir}"
                + (f", synced to {storage.tree.label}" if storage is not None else ""),
                highlight=False,
            )
            done = len(trials) - len(queue)
            progress = ExperimentProgress(console, len(trials), done, per_trial)
            limits = PoolLimits(parallel, kill_grace_s, trial_timeout_s)
            warm = (
                None
                if plan is None
                else WarmSlots(plan, parallel, ExperimentPaths(out_dir).warm_logs)
            )
            pool = executor.trial_pool(command, limits, warm)
            pool.env.update(storage.env() if storage is not None else {})
            with progress, pool, forward_signals(pool.interrupt):
                _run_queue(
                    queue=queue,
                    pool=pool,
                    tracker=tracker,
                    progress=progress,
                    console=console,
                    result=result,
                )
        except BaseException:
            # a bug or an interrupt outside the loop: the pool already stopped every trial;
            # close the parent run so MLflow does not show it running forever
            _track(console, result, "close the parent run", tracker.end_experiment, "FAILED")
            raise
        result.interrupted_by = pool.interrupted
        _finish_trials(trials, queue, result)
        if report and result.interrupted_by is None:
            _report(cfg, out_dir, tracker, console, result)
        if stage is None:  # a stage's caller closes the parent after its last stage
            status = _parent_status(result)
            _track(console, result, "close the parent run", tracker.end_experiment, status)
    _print_summary(console, result)
    return result


@contextmanager
def _published(storage: Storage | None, out_dir: Path, console: Console) -> Iterator[None]:
    """On the way out (finished, failed or interrupted), push the driver's files to the
    bucket; a failure to do so is printed, never hides the run's own outcome."""
    try:
        yield
    finally:
        if storage is not None:
            try:
                publish_working_copy(storage, out_dir)
            except StorageError as exc:
                console.print(f"[red]error:[/red] {exc}", highlight=False)


def _parent_status(result: ExperimentResult) -> str:
    if result.interrupted_by is not None:
        return "KILLED"
    return "FAILED" if result.failed else "FINISHED"


def _report(
    cfg: ExperimentConfig,
    out_dir: Path,
    tracker: Tracker,
    console: Console,
    result: ExperimentResult,
) -> None:
    """Build `<out_dir>/report/` and log it to the parent run; a failure is reported, not
    raised, because the trials (the expensive part) are already safe on disk."""
    # Imported here: the analysis package pulls in matplotlib, which `harness run` only needs now.
    from analysis import build_report, log_report_to_mlflow

    try:
        built = build_report(out_dir, out_dir / REPORT_DIR, config=cfg.report)
    except Exception as exc:  # the report must not hide the trials' outcome
        result.report_error = f"{type(exc).__name__}: {exc}"
        console.print(f"[red]report failed:[/] {result.report_error}", highlight=False)
        return
    result.report_paths.update(
        markdown=built.markdown_path, html=built.html_path, summary=built.summary_path
    )
    log = log_report_to_mlflow
    _track(console, result, "log the report", tracker.log_report, built.out_dir, built.summary, log)


def _print_summary(console: Console, result: ExperimentResult) -> None:
    counts: dict[str, int] = {}
    for trial in result.trials:
        counts[trial.status] = counts.get(trial.status, 0) + 1
    shown = ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
    console.print(f"trials: {shown}", highlight=False)
    for trial in result.failed:
        console.print(f"[red]failed[/] {trial.spec.trial_name}: {trial.message}", highlight=False)
    for key, path in result.report_paths.items():
        console.print(f"report ({key}): {path}", highlight=False)
    if result.parent_run_id:
        console.print(f"MLflow: {result.tracking_uri} run {result.parent_run_id}", highlight=False)
    if result.interrupted_by is not None:
        console.print("interrupted; run the same command again to resume", highlight=False)
