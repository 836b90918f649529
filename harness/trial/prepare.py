"""A trial's inputs, written before any component starts: resolved config, prompts, record.

Every arm and seed of an experiment gets the same prompts (`prompt_table`; equal digests prove
matched arms), and `trial.json` names the model's and the prompt set's digests, so a resumed or
re-run trial can be checked against what it was prepared with.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import yaml

from contract.layout import TrialPaths
from contract.record import TrialRecord, TrialRecordError, read_trial_record, write_trial_record
from contract.trial import TERMINAL_STATUSES, TrialSpec, TrialStatus
from harness.config import ExperimentConfig
from harness.executors.base import TrialFailedError
from harness.models.factory import build_model_dir, load_tokenizer, weights_digest
from harness.provenance import file_digest, provenance
from harness.tasks.factory import make_rendered_task
from harness.tasks.mixture import make_train_mixture


def run_id_for(cfg: ExperimentConfig, spec: TrialSpec) -> str:
    """Redis namespace of a trial: many trials (and experiments) may share one Redis."""
    return f"{cfg.name}.{cfg.config_hash()}.{spec.name}"


def prompt_table(
    cfg: ExperimentConfig, spec: TrialSpec, steps: int, model_dir: Path
) -> pd.DataFrame:
    """The exact prompts the trial trains and evaluates on; equal tables prove matched arms.

    `prompt` is the rendered text (chat template applied, `task.prompt_format`) that the model
    is given, so the prompt-set digest changes when the rendering does. `task` names where a row
    came from: the training mixture's component (task.name without `train_tasks`), or the eval
    set (`heldout` without `evals`).
    """
    tokenizer = load_tokenizer(model_dir)
    mixture = make_train_mixture(cfg, tokenizer)
    n_train = steps * cfg.learner.prompts_per_step
    rows = []
    for i in range(n_train):
        component, p = mixture.prompt(spec.seed, i)
        rows.append(("train", component.name, p.index, p.text, p.ground_truth))
    for name, task_cfg in cfg.eval_sets():
        evals = make_rendered_task(task_cfg, tokenizer).eval_prompts(task_cfg.eval_size)
        rows += [("eval", name, p.index, p.text, p.ground_truth) for p in evals]
    return pd.DataFrame(rows, columns=["split", "task", "index", "prompt", "ground_truth"])


def prepare_trial(
    cfg: ExperimentConfig, spec: TrialSpec, paths: TrialPaths, steps: int, resume: bool
) -> TrialRecord:
    """Write resolved config, prompt set and the trial record; returns the record."""
    paths.root.mkdir(parents=True, exist_ok=True)
    previous = _previous_record(paths)
    if previous and previous.status in TERMINAL_STATUSES and not resume:
        raise TrialFailedError(
            f"trial {spec.name} already finished ({previous.status.value}) in {paths.root}"
        )
    if not resume:
        for stale in (
            paths.checkpoints,
            paths.metrics,
            paths.evals,
            paths.weights,
            paths.redis_dir,
        ):
            _remove_tree(stale)
        paths.learner_outcome.unlink(missing_ok=True)
    paths.resolved_config.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    model_dir = build_model_dir(cfg.model, cfg.task)
    prompt_table(cfg, spec, steps, model_dir).to_parquet(paths.prompts, index=False)
    arm = cfg.arm(spec.arm)
    record = TrialRecord(
        experiment=cfg.name,
        trial_name=spec.name,
        arm=spec.arm,
        objective=arm.objective,
        seed=spec.seed,
        lag=spec.lag,
        mode=spec.mode,
        status=TrialStatus.RUNNING,
        diverged=False,
        diverged_reason=None,
        failure_reason=None,
        steps_planned=steps,
        steps_completed=0,
        config_hash=cfg.config_hash(),
        initial_weights_digest=weights_digest(model_dir),
        prompt_set_digest=file_digest(paths.prompts),
        model_dir=str(model_dir),
        started_at=(previous and previous.started_at) or datetime.now(UTC).isoformat(),
        finished_at=None,
        resumed=resume,
        provenance=provenance(),
    )
    write_trial_record(paths.root, record)
    return record


def _previous_record(paths: TrialPaths) -> TrialRecord | None:
    """The record an earlier attempt left, if valid. An invalid one (hand-edited, truncated) is
    replaced: `harness run` resumes such trials, and the checkpoints tell where to go on."""
    try:
        return read_trial_record(paths.root)
    except TrialRecordError as exc:
        print(f"warning: {exc}; writing a new record", flush=True)
        return None


def _remove_tree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
