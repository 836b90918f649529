"""The experiment grid: seed-major expansion and classifying trials by their trial.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import ExperimentConfig
from harness.experiment.grid import TrialStateError, classify_trial, expand_trials
from tests.harness.test_experiment import IDENTITY, config_data, write_json


def test_expand_trials_is_seed_major_with_contract_names(tmp_path: Path) -> None:
    data = config_data(tmp_path, seeds=[0, 1, 2], staleness={"mode": "bounded", "lags": [0, 2]})
    data["arms"].append({"name": "ppo", "objective": "ppo"})
    cfg = ExperimentConfig.model_validate(data)
    specs = expand_trials(cfg)
    assert len(specs) == 3 * 2 * 3  # seeds x lags x arms
    assert len({s.trial_name for s in specs}) == len(specs)
    # first 6 trials: all of seed 0, so a half-finished experiment stays balanced across arms
    assert [s.trial_name for s in specs[:4]] == [
        "gspo__seed0__lag0__bounded",
        "grpo__seed0__lag0__bounded",
        "ppo__seed0__lag0__bounded",
        "gspo__seed0__lag2__bounded",
    ]
    assert {s.seed for s in specs[:6]} == {0}
    assert specs[-1].trial_name == "ppo__seed2__lag2__bounded"
    assert specs[0].trial_dir == tmp_path.resolve() / "exp" / "trials" / specs[0].trial_name
    assert specs[2].objective == "ppo"


@pytest.mark.parametrize(
    ("status", "state"),
    [("completed", "done"), ("diverged", "done"), ("running", "resume"), ("failed", "resume")],
)
def test_classify_by_trial_json_status(tmp_path: Path, status: str, state: str) -> None:
    spec = expand_trials(ExperimentConfig.model_validate(config_data(tmp_path)))[0]
    write_json(spec.trial_dir, arm="gspo", seed=0, lag=0, mode="fixed", status=status)
    found = classify_trial(spec)
    assert (found.state, found.status, found.problem) == (state, status, None)


def test_classify_pending_corrupt_unknown_and_foreign(tmp_path: Path) -> None:
    spec = expand_trials(ExperimentConfig.model_validate(config_data(tmp_path)))[0]
    assert classify_trial(spec).state == "pending"  # no directory at all
    spec.trial_dir.mkdir(parents=True)
    assert classify_trial(spec).state == "pending"  # directory without trial.json
    (spec.trial_dir / "trial.json").write_text('{"status": "compl')
    corrupt = classify_trial(spec)
    assert corrupt.state == "resume" and "not valid JSON" in str(corrupt.problem)
    write_json(spec.trial_dir, **IDENTITY, status="queued")
    unknown = classify_trial(spec)
    assert unknown.state == "resume" and "unknown status 'queued'" in str(unknown.problem)
    # a record without its identity is not trusted to be finished: resumed, the field named
    write_json(spec.trial_dir, arm="gspo", seed=0, status="completed")
    partial = classify_trial(spec)
    assert partial.state == "resume" and "lag: Field required" in str(partial.problem)
    write_json(spec.trial_dir, **(IDENTITY | {"arm": "grpo"}), status="completed")
    with pytest.raises(TrialStateError, match="belongs to trial gspo__seed0__lag0__fixed"):
        classify_trial(spec)


def test_classify_warns_on_other_config_hash_or_steps(tmp_path: Path) -> None:
    spec = expand_trials(ExperimentConfig.model_validate(config_data(tmp_path)))[0]
    write_json(spec.trial_dir, **IDENTITY, status="completed", config_hash="old")
    found = classify_trial(spec, config_hash="new")
    assert found.state == "done" and "config hash old" in str(found.problem)
    assert classify_trial(spec, config_hash="old").problem is None
    write_json(spec.trial_dir, **IDENTITY, status="completed", config_hash="old", steps_planned=2)
    short = classify_trial(spec, config_hash="old", steps=20)
    assert short.state == "done" and "ran for 2 planned steps" in str(short.problem)
    assert classify_trial(spec, config_hash="old", steps=2).problem is None
