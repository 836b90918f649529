"""`harness run` with a `tuning:` section: tune every arm on an equal budget, then compare.

Two stages, each an ordinary experiment run by `run_experiment` under one MLflow parent run:

1. tuning (`<out>/tuning/`): every configuration of every arm's search space is an arm of its
   own (`grpo-c3`, harness.config.tuning.tuned_arm_name), trained on `tuning.seeds` and scored
   on the validation eval set alone (it is the stage's only, hence primary, eval set);
2. final (`<out>/`): each arm with its selected settings, under its own name, on `seeds`, with
   every eval set but the validation one (the first is the test set the report scores).

Selection is a pure function of the tuning trials on disk: per arm, the configuration with the
highest mean validation score over the tuning seeds it finished (`tuning.metric`: final pass
rate or AUC; a diverged trial scores 0 as in the report; ties go to the first configuration).
A rerun resumes whichever stage is unfinished, recomputes the same selection from the same
files, and skips finished final trials: the final stage's config carries the selection
(`selection`, part of the config hash), so a final trial run under another selection is named
as a config mismatch, never silently mixed. The selection (`contract.tuning.TuningSelection`)
and every tuning trial's score are written to `<out>/tuning/selection.json` and
`tuning_scores.parquet` (the report's Tuning section reads them) and logged to the parent run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from rich.console import Console

from contract.layout import TUNING_DIR, TUNING_SCORES, TUNING_SELECTION
from contract.tuning import ArmSelection, TriedConfiguration, TuningSelection, ValidationSet
from harness.config import ExperimentConfig, resolved_dump, validate_config
from harness.config.tuning import TuningConfig, tuned_arm_name
from harness.experiment.request import ExperimentRequest
from harness.experiment.run import ExperimentResult, Stage, run_experiment
from harness.experiment.software import stages_software_line
from harness.experiment.tracking import open_tracker
from harness.launch.trials import CommandBuilder, trial_command
from harness.overrides import ConfigError
from harness.storage.output import is_uri
from harness.tasks.factory import held_out_prompts, make_task

STAGE_CONFIG = "stage_config.yaml"


def tuning_stage_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The tuning stage as an experiment: one arm per configuration, the tuning seeds, and the
    validation set as its only eval set."""
    tuning = _tuning(cfg)
    data = _without_stages(cfg)
    data["arms"] = [
        {**resolved_dump(arm), **settings, "name": tuned_arm_name(arm.name, index)}
        for arm in cfg.arms
        for index, settings in enumerate(tuning.configurations(arm.name))
    ]
    data["seeds"] = list(tuning.seeds)
    data["evals"] = [e for e in data["evals"] if e["name"] == tuning.validation]
    return validate_config(data)


def final_stage_config(cfg: ExperimentConfig, selection: TuningSelection) -> ExperimentConfig:
    """The comparison: each arm with its selected settings, the evaluation seeds, every eval set
    but the validation one, and the selection stamped on the config (hence on its hash)."""
    tuning = _tuning(cfg)
    data = _without_stages(cfg)
    data["arms"] = [{**resolved_dump(arm), **selection.arms[arm.name].settings} for arm in cfg.arms]
    data["evals"] = [e for e in data["evals"] if e["name"] != tuning.validation]
    data["selection"] = selection.stamp().model_dump(mode="json")
    return validate_config(data)


def check_validation_is_held_out(cfg: ExperimentConfig) -> None:
    """The validation set must share no prompt with any eval set of the final stage (the test
    sets): ConfigError naming both sets and a shared prompt otherwise. Checked on the raw
    prompt texts, before anything runs."""
    tuning = _tuning(cfg)
    sets = dict(cfg.eval_sets())
    validation_task = sets[tuning.validation]
    validation = {p.text for p in held_out_prompts(make_task(validation_task), validation_task)}
    for name, task in sets.items():
        if name == tuning.validation:
            continue
        shared = validation & {p.text for p in held_out_prompts(make_task(task), task)}
        if shared:
            raise ConfigError(
                f"tuning.validation={tuning.validation!r} shares {len(shared)} prompt(s) with "
                f"eval set {name!r} (e.g. {sorted(shared)[0]!r}), which the final stage scores: "
                "set the validation task's eval_offset to at least "
                f"{task.eval_offset + task.eval_size} so that it starts after them"
            )


def tuning_scores(cfg: ExperimentConfig, tuning_dir: Path) -> pd.DataFrame:
    """One row per tuning trial on disk: arm, config, seed, score (validation; NaN when it did
    not finish), status, and the searched settings as `param.<name>` columns."""
    from analysis.loading import load_experiment  # analysis pulls in matplotlib: load late
    from analysis.trial_scores import score_trials

    tuning = _tuning(cfg)
    experiment = load_experiment(tuning_dir)
    scored = score_trials(experiment, cfg.report)
    column = "final_score" if tuning.metric == "final" else "auc"
    by_name = {}
    if len(scored):
        for row in scored.itertuples(index=False):
            by_name[(row.arm, int(row.seed))] = row
    keys = sorted({key for arm in cfg.arms for key in tuning.space[arm.name].keys})
    rows = []
    for arm in cfg.arms:
        for index, settings in enumerate(tuning.configurations(arm.name)):
            for seed in tuning.seeds:
                row = by_name.get((tuned_arm_name(arm.name, index), seed))
                score = float(getattr(row, column)) if row is not None and row.scored else math.nan
                status = "missing" if row is None else str(row.status)
                entry = {"arm": arm.name, "config": index, "seed": seed, "score": score}
                entry["status"] = status
                for key in keys:
                    value = settings.get(key, math.nan)
                    entry[f"param.{key}"] = value
                rows.append(entry)
    frame = pd.DataFrame(rows)
    for key in keys:  # numbers as float64, anything else as text
        col = frame[f"param.{key}"]
        numeric = pd.to_numeric(col, errors="coerce")
        if numeric.notna().sum() == col.notna().sum():
            frame[f"param.{key}"] = numeric.astype("float64")
        else:
            frame[f"param.{key}"] = col.astype("string")
    return frame.astype({"config": "int64", "seed": "int64", "score": "float64"})


def select_configurations(cfg: ExperimentConfig, scores: pd.DataFrame) -> TuningSelection:
    """Per arm, the configuration with the highest mean validation score over the tuning seeds
    it finished; ties go to the first. ConfigError when an arm has no scored configuration."""
    tuning = _tuning(cfg)
    validation = dict(cfg.eval_sets())[tuning.validation]
    return TuningSelection(
        metric=tuning.metric,
        validation=ValidationSet(
            name=tuning.validation,
            task=validation.name,
            offset=validation.eval_offset,
            size=validation.eval_size,
        ),
        budget=tuning.budget,
        seeds=list(tuning.seeds),
        evaluation_seeds=list(cfg.seeds),
        arms={arm.name: _select_arm(tuning, arm.name, scores) for arm in cfg.arms},
    )


def _select_arm(tuning: TuningConfig, arm: str, scores: pd.DataFrame) -> ArmSelection:
    """One arm's configurations scored by their mean over finished tuning seeds, and the best."""
    configs = []
    for index, settings in enumerate(tuning.configurations(arm)):
        mine = scores[(scores["arm"] == arm) & (scores["config"] == index)]
        finite = mine["score"].dropna()
        mean = float(finite.mean()) if len(finite) else math.nan
        configs.append(
            TriedConfiguration(index=index, settings=settings, score=mean, n_seeds=len(finite))
        )
    ranked = [c for c in configs if not math.isnan(c.score)]
    if not ranked:
        raise ConfigError(
            f"tuning: no configuration of arm {arm!r} has a validation score on any "
            "tuning seed (every tuning trial failed?); see the trials under the tuning/ "
            "directory, fix the cause and rerun `harness run` to resume"
        )
    best = max(ranked, key=lambda c: (c.score, -c.index))
    return ArmSelection(
        selected=best.index, score=best.score, settings=best.settings, configs=configs
    )


def run_tuned_experiment(
    request: ExperimentRequest,
    *,
    console: Console | None = None,
    command_prefix: Sequence[str] | None = None,
    report: bool = True,
    **kwargs: Any,
) -> ExperimentResult:
    """Run (or resume) the tuning stage, select, then run (or resume) the final stage.

    Each stage's derived config is written to its directory (`stage_config.yaml`) and its
    trials run from it, without the launch's overrides (already applied). Stops after the
    tuning stage when any tuning trial failed or the launch was interrupted: the budget is
    equal only when every configuration ran on every tuning seed. `command_prefix` replaces
    `harness` in each stage's trial command (tests run a small stand-in); `report` builds the
    report after the final stage; other keyword arguments go to both stages' `run_experiment`.
    """
    console = console or Console()
    cfg, out_dir, steps = request.cfg, request.out_dir, request.steps
    if cfg.executor.kind != "local" or is_uri(cfg.output_dir) or is_uri(str(out_dir or "")):
        raise ConfigError(
            "a tuning stage runs with executor.kind=local and a local output_dir for now; "
            "run the tuning with those, or drop `tuning` and set the arms' settings by hand"
        )
    check_validation_is_held_out(cfg)
    root = Path(out_dir) if out_dir is not None else Path(cfg.output_dir) / cfg.name
    root = root.expanduser().resolve()
    tuning_dir = root / TUNING_DIR
    tracker = open_tracker(cfg, root)
    tracker.start_experiment(request)
    status = "FAILED"
    try:
        stage_cfg = tuning_stage_config(cfg)
        stage_path = _write_stage_config(stage_cfg, tuning_dir)
        console.print(f"tuning stage: {len(stage_cfg.arms)} configurations", highlight=False)
        tuned = run_experiment(
            request.stage(stage_cfg, stage_path, tuning_dir), console=console,
            command=_command(stage_path, steps, command_prefix), report=False,
            stage=Stage("tuning", tracker), **kwargs,
        )  # fmt: skip
        if tuned.exit_code != 0:
            if tuned.interrupted_by is not None:
                status = "KILLED"
            console.print(
                "tuning stage unfinished: the final stage needs every configuration on every "
                "tuning seed; rerun `harness run` to resume",
                highlight=False,
            )
            return tuned
        scores = tuning_scores(cfg, tuning_dir)
        scores.to_parquet(tuning_dir / TUNING_SCORES, index=False)
        selection = select_configurations(cfg, scores)
        (tuning_dir / TUNING_SELECTION).write_text(selection.to_json())
        tracker.log_selection(selection)
        for arm, entry in selection.arms.items():
            console.print(
                f"selected {arm}: configuration {entry.selected} {entry.settings} "
                f"(validation {selection.metric} {entry.score:.4f})",
                highlight=False,
            )
        final_cfg = final_stage_config(cfg, selection)
        final_path = _write_stage_config(final_cfg, root)
        result = run_experiment(
            request.stage(final_cfg, final_path, root), console=console,
            command=_command(final_path, steps, command_prefix), report=report,
            stage=Stage("final", tracker), **kwargs,
        )  # fmt: skip
        software = stages_software_line(root, tuning_dir)
        if software:  # the selection was made under other software than the final comparison
            result.warnings.append(software)
            console.print(f"[yellow]warning:[/] {software}", highlight=False)
        status = {0: "FINISHED"}.get(result.exit_code, "FAILED")
        if result.interrupted_by is not None:
            status = "KILLED"
        return result
    finally:
        tracker.end_experiment(status)


def _command(path: Path, steps: int | None, prefix: Sequence[str] | None) -> CommandBuilder:
    """The stage's trial command: its own config file, no overrides (already applied)."""
    if prefix is None:
        return trial_command(path, (), steps)
    return trial_command(path, (), steps, prefix=prefix)


def _write_stage_config(stage_cfg: ExperimentConfig, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / STAGE_CONFIG
    path.write_text(yaml.safe_dump(resolved_dump(stage_cfg), sort_keys=False))
    return path


def _tuning(cfg: ExperimentConfig) -> TuningConfig:
    if cfg.tuning is None:
        raise ValueError("the experiment has no `tuning` section")
    return cfg.tuning


def _without_stages(cfg: ExperimentConfig) -> dict[str, Any]:
    data = resolved_dump(cfg)
    data.pop("tuning", None)
    data.pop("selection", None)
    return data


__all__ = [
    "check_validation_is_held_out",
    "final_stage_config",
    "run_tuned_experiment",
    "select_configurations",
    "tuning_scores",
    "tuning_stage_config",
]
