"""A trial's inputs, written before any component starts: resolved config, prompts, record.

Every arm and seed of an experiment gets the same prompts (`prompt_table`; equal digests prove
matched arms), and `trial.json` names the model's and the prompt set's digests, so a resumed or
re-run trial can be checked against what it was prepared with.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from contract.durable import file_digest
from contract.environment import resume_line
from contract.layout import TrialPaths
from contract.record import TrialRecord, TrialRecordError, read_trial_record, write_trial_record
from contract.regime import TrialRegime
from contract.trial import TERMINAL_STATUSES, TrialSpec, TrialStatus
from harness.config import HASH_EXCLUDED, ConfigError, ExperimentConfig, resolved_dump
from harness.executors.base import TrialFailedError
from harness.models.model_dir import build_model_dir, weights_digest
from harness.models.tokenizer import load_tokenizer
from harness.provenance import provenance
from harness.tasks.factory import held_out_prompts, make_rendered_task
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
        evals = held_out_prompts(make_rendered_task(task_cfg, tokenizer), task_cfg)
        rows += [("eval", name, p.index, p.text, p.ground_truth) for p in evals]
    return pd.DataFrame(rows, columns=["split", "task", "index", "prompt", "ground_truth"])


class ResumeConfigError(ConfigError):
    """`--resume` with a config other than the one the trial ran with."""


def check_resume_config(cfg: ExperimentConfig, paths: TrialPaths, trial_name: str) -> None:
    """Refuse to resume a trial under a config whose hash differs from the one in its record,
    naming the changed fields; reads the trial directory, never writes it.

    Its checkpoints, Redis state (the run id holds the hash) and metrics belong to the config it
    ran with: going on under another would mix two configs in one curve. Fields the hash leaves
    out (`HASH_EXCLUDED`: seeds, executor, max_parallel) may change. Nothing to compare (no
    record, or none with a hash) passes: the resume itself then decides from the checkpoints.
    """
    try:
        previous = read_trial_record(paths.root)
    except TrialRecordError:
        return
    new_hash = cfg.config_hash()
    if previous is None or previous.config_hash in (None, new_hash):
        return
    changes = _changed_fields(_previous_fields(paths), cfg.hashed_fields())
    if not changes:
        changes = ["no field (a plugin's source, or the defaults of another harness version)"]
    raise ResumeConfigError(
        f"--resume: trial {trial_name} in {paths.root} ran with config hash "
        f"{previous.config_hash}, this config's is {new_hash}; changed: {', '.join(changes)}; "
        f"resume with the config it ran with ({paths.resolved_config}), or run this one in "
        "another --out (the checkpoints there belong to the old config)"
    )


def _previous_fields(paths: TrialPaths) -> dict[str, Any] | None:
    """The hashed fields of the resolved config the trial ran with; None if unreadable."""
    try:
        data = yaml.safe_load(paths.resolved_config.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    if not isinstance(data, dict):
        return None
    return {
        key: value
        for key, value in data.items()
        if key not in HASH_EXCLUDED and not (key == "plugins" and not value)
    }


def _changed_fields(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """`dotted.path old -> new` for every leaf that differs, sorted by path."""
    if old is None:
        return ["unknown (no readable resolved_config.yaml from the previous attempt)"]
    flat_old, flat_new = _flatten(old), _flatten(new)
    return [
        f"{key} {_shown(flat_old.get(key, _UNSET))} -> {_shown(flat_new.get(key, _UNSET))}"
        for key in sorted(flat_old.keys() | flat_new.keys())
        if flat_old.get(key, _UNSET) != flat_new.get(key, _UNSET)
    ]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves by dotted path; list items with unique names by name (`arms.gspo.lr`, as
    overrides address them), other lists whole."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        names = [item.get("name") for item in value]
        named = all(isinstance(n, str) for n in names) and len(set(names)) == len(names)
        items = zip(names if named else map(str, range(len(value))), value, strict=True)
    else:
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in items:
        flat |= _flatten(item, f"{prefix}.{key}" if prefix else str(key))
    return flat


_UNSET = object()  # a field one config has and the other lacks


def _shown(value: Any) -> str:
    return "(unset)" if value is _UNSET else json.dumps(value)


def prepare_trial(
    cfg: ExperimentConfig, spec: TrialSpec, paths: TrialPaths, steps: int, resume: bool
) -> TrialRecord:
    """Write resolved config, prompt set and the trial record; returns the record."""
    if resume:  # `harness trial` checked before taking the lock; a direct caller is checked here
        check_resume_config(cfg, paths, spec.name)
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
    paths.resolved_config.write_text(yaml.safe_dump(resolved_dump(cfg), sort_keys=False))
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
        provenance=_provenance_of_attempt(previous if resume else None),
        regime=trial_regime(cfg, spec),
    )
    write_trial_record(paths.root, record)
    return record


def trial_regime(cfg: ExperimentConfig, spec: TrialSpec) -> TrialRegime:
    """The regime `spec` runs under, resolved once for its record (`contract.regime`)."""
    regime, arm = cfg.regime(spec.arm), cfg.arm(spec.arm)
    return TrialRegime(
        mode=spec.mode,
        lag=spec.lag,
        partial_rollouts=regime.partial_rollouts,
        sync_every=regime.sync_every,
        correction=arm.correction or "",
    )


def _provenance_of_attempt(previous: TrialRecord | None) -> dict[str, Any]:
    """This attempt's provenance. A resumed trial whose software changed since it began says so
    in one line (`contract.environment.resume_line`), and its record keeps every such line
    (`software_changes`): its metrics came from more than one environment."""
    facts = provenance()
    earlier = (previous.provenance or {}) if previous else {}
    changes = list(earlier.get("software_changes", []))
    line = resume_line(earlier, facts) if previous else None
    if line:
        print(f"warning: {line}", flush=True)
        changes.append(line)
    if changes:
        facts["software_changes"] = changes
    return facts


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
