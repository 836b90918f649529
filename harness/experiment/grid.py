"""The experiment grid (arms x seeds x lags) and the on-disk state of each trial in it.

A trial is one (arm, seed, lag, mode) run of the trial runner in its own directory
`<output_dir>/<name>/trials/<trial_name>/`; its `trial.json` says how far it got. Reading that
file is the only way `harness run` decides what to skip, resume or start, so a re-launch after a
crash or Ctrl-C picks up exactly where the disk says the experiment is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from contract.layout import ExperimentPaths
from contract.record import TrialRecord, TrialRecordError, read_trial_record
from contract.trial import TERMINAL_STATUSES, StalenessMode, TrialSpec, TrialStatus
from harness.config import ExperimentConfig
from harness.launch.trials import PlannedTrial

TrialState = Literal["pending", "resume", "done"]


class TrialStateError(RuntimeError):
    """A trial directory holds something that is not the trial the grid expects there."""


@dataclass(frozen=True)
class TrialOnDisk:
    """What a trial directory says about its trial before a launch.

    `state`: `pending` (never started: start fresh), `resume` (started, not finished: start
    with `--resume`), `done` (completed or diverged: skip). `problem` is a warning to print.
    `record` is the trial.json record, None when there is none or it is not valid.
    """

    spec: PlannedTrial
    state: TrialState
    status: TrialStatus | None
    record: TrialRecord | None
    problem: str | None = None


def trial_name(arm: str, seed: int, lag: int, mode: StalenessMode) -> str:
    """`gspo__seed0__lag2__fixed`: sortable, unique within an experiment, safe in paths.

    Delegates to the trial runner's own spec, so the directory the grid expects and the name
    the runner writes into trial.json cannot drift apart.
    """
    return TrialSpec(arm=arm, seed=seed, lag=lag, mode=mode).name


def experiment_dir(cfg: ExperimentConfig) -> Path:
    """`<output_dir>/<name>`, absolute so trial subprocesses and SQLite URIs agree on it."""
    return (Path(cfg.output_dir).expanduser() / cfg.name).resolve()


def expand_trials(cfg: ExperimentConfig, out_dir: Path | None = None) -> list[PlannedTrial]:
    """Every (seed, lag, arm) trial, seed-major.

    Why seed-major: trials run in this order, so an experiment stopped half way holds whole
    seeds with every arm and lag, i.e. a balanced (if smaller) matched comparison, instead of
    all seeds of one arm and none of another.
    """
    experiment = ExperimentPaths(out_dir if out_dir is not None else experiment_dir(cfg))
    mode = cfg.staleness.mode
    specs = []
    for seed in cfg.seeds:
        for lag in cfg.staleness.lags:
            for arm in cfg.arms:
                if lag not in cfg.regime(arm.name).lags:  # the arm runs at some lags only
                    continue
                name = trial_name(arm.name, seed, lag, mode)
                trial_dir = experiment.trial(name).root
                specs.append(
                    PlannedTrial(arm.name, arm.objective, seed, lag, mode, name, trial_dir)
                )
    return specs


def _check_identity(spec: PlannedTrial, record: TrialRecord) -> None:
    """Refuse to skip or resume a directory that holds another trial (e.g. a copied dir)."""
    expected = {"arm": spec.arm, "seed": spec.seed, "lag": spec.lag, "mode": spec.mode}
    for key, want in expected.items():
        found = getattr(record, key)
        if found != want:
            raise TrialStateError(
                f"{spec.paths.metadata} says {key}={found!r} but the directory "
                f"belongs to trial {spec.trial_name} ({key}={want!r}); remove or move that "
                "directory, or use another output_dir"
            )


def _mismatch(record: TrialRecord, config_hash: str | None, steps: int | None) -> str | None:
    """Why a trial's results are not comparable with this launch's config, if they are not."""
    ran_hash, ran_steps = record.config_hash, record.steps_planned
    if config_hash is not None and ran_hash is not None and ran_hash != config_hash:
        return (
            f"ran with config hash {ran_hash}, the current config's is {config_hash}: its "
            "results mix two configs; use a new output_dir to rerun it"
        )
    if steps is not None and ran_steps is not None and ran_steps != steps:
        return (
            f"ran for {ran_steps} planned steps, this launch plans {steps} (--steps?): its "
            "curves are not comparable; use a new output_dir to rerun it"
        )
    return None


def classify_trial(
    spec: PlannedTrial, config_hash: str | None = None, steps: int | None = None
) -> TrialOnDisk:
    """Decide whether `spec` is to be started, resumed or skipped, from its trial.json.

    An invalid trial.json (unreadable, an unknown status, identity keys missing) is resumed
    (the runner keeps checkpoints and knows best whether they are usable) rather than skipped,
    so a result is never assumed. A trial run under another config hash or step count is still
    skipped or resumed as its status says, with a warning in `problem` (the harness never
    deletes results).
    """
    try:
        record = read_trial_record(spec.trial_dir)
    except TrialRecordError as exc:
        return TrialOnDisk(spec, "resume", None, None, f"{exc}; resuming it")
    if record is None:
        return TrialOnDisk(spec, "pending", None, None)
    _check_identity(spec, record)
    problem = _mismatch(record, config_hash, steps)
    state: TrialState = "done" if record.status in TERMINAL_STATUSES else "resume"
    return TrialOnDisk(spec, state, record.status, record, problem)


def classify_trials(
    specs: list[PlannedTrial], config_hash: str | None = None, steps: int | None = None
) -> list[TrialOnDisk]:
    """`classify_trial` for each spec, in grid order."""
    return [classify_trial(spec, config_hash, steps) for spec in specs]
