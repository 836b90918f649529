"""Reading trial directories: part files, schema drift, gaps, corruption, missing pieces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.loading import KEY_COLUMNS, load_experiment, read_metrics, trials_dir
from analysis.sections.trials import policy_line
from contract import metrics as mn


def _info(name: str, **over: object) -> dict:
    base = {
        "experiment": "exp",
        "trial_name": name,
        "arm": "gspo",
        "objective": "gspo",
        "seed": 0,
        "lag": 0,
        "mode": "fixed",
        "status": "completed",
        "diverged": False,
        "diverged_reason": None,
        "steps_planned": 5,
    }
    return {**base, **over}


def _part(path: Path, columns: dict[str, list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        k: pa.array(v, pa.int64() if k == mn.STEP else pa.float64()) for k, v in columns.items()
    }
    pq.write_table(pa.table(arrays), path)


def _trial(root: Path, name: str, **over: object) -> Path:
    trial = root / "trials" / name
    trial.mkdir(parents=True)
    (trial / "trial.json").write_text(json.dumps(_info(name, **over)))
    return trial


def test_parts_with_schema_drift_gap_and_duplicates(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.parquet"
    nan = float("nan")
    _part(
        metrics / "part-000000.parquet",
        {mn.STEP: [0, 1], mn.TIMESTAMP: [10.0, 11.0], mn.EVAL_PASS_RATE: [0.1, nan]},
    )
    # part-000001 is absent (gap); part 2 adds a metric and re-writes step 1 (a resume).
    _part(
        metrics / "part-000002.parquet",
        {
            mn.STEP: [1, 2],
            mn.TIMESTAMP: [12.0, 13.0],
            mn.EVAL_PASS_RATE: [nan, 0.3],
            mn.POLICY_KL_OLD: [0.01, 0.02],
            "not/a_metric": [1.0, 2.0],
        },
    )
    frame, problems = read_metrics(metrics)
    assert problems == []
    assert frame[mn.STEP].tolist() == [0, 1, 2]
    assert frame[mn.TIMESTAMP].tolist() == [10.0, 12.0, 13.0]  # step 1 from the later part
    assert np.isnan(frame[mn.POLICY_KL_OLD].iloc[0])  # absent in part 0 -> missing
    assert "not/a_metric" not in frame.columns  # analysis reads only metric_names


def test_corrupt_part_is_reported_and_skipped(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.parquet"
    _part(metrics / "part-000000.parquet", {mn.STEP: [0, 1], mn.EVAL_PASS_RATE: [0.1, 0.2]})
    (metrics / "part-000001.parquet").write_bytes(b"half-written")
    frame, problems = read_metrics(metrics)
    assert frame[mn.STEP].tolist() == [0, 1]
    assert len(problems) == 1 and "part-000001.parquet" in problems[0]


def test_absent_and_empty_metrics(tmp_path: Path) -> None:
    frame, problems = read_metrics(tmp_path / "metrics.parquet")
    assert frame.empty and problems == ["metrics.parquet absent"]
    (tmp_path / "metrics.parquet").mkdir()
    frame, problems = read_metrics(tmp_path / "metrics.parquet")
    assert frame.empty and problems == ["no metric rows yet"]


def test_load_experiment_tidy_frame_and_problems(tmp_path: Path) -> None:
    good = _trial(tmp_path, "gspo-s0")
    _part(
        good / "metrics.parquet" / "part-000000.parquet",
        {mn.STEP: [0, 5], mn.TIMESTAMP: [0.0, 5.0], mn.EVAL_PASS_RATE: [0.1, 0.5]},
    )
    _trial(tmp_path, "grpo-s0", arm="grpo", status="running")  # no metrics yet
    (tmp_path / "trials" / "no-json").mkdir()
    (tmp_path / "trials" / "bad-json").mkdir()
    (tmp_path / "trials" / "bad-json" / "trial.json").write_text("{not json")
    experiment = load_experiment(tmp_path)

    assert experiment.trials["trial_name"].tolist() == ["grpo-s0", "gspo-s0"]  # sorted by dir
    assert list(experiment.metrics.columns) == [
        *KEY_COLUMNS,
        mn.STEP,
        mn.TIMESTAMP,
        mn.EVAL_PASS_RATE,
    ]
    assert experiment.metrics["arm"].unique().tolist() == ["gspo"]
    problems = experiment.problems.set_index("trial_name")["problem"]
    assert problems["no-json"] == "trial.json absent"
    assert "bad-json" in problems.index
    grpo = problems[["grpo-s0"]].tolist()
    assert "metrics.parquet absent" in grpo and "status 'running': excluded from scores" in grpo


def test_trials_dir_accepts_root_or_trials_and_explains_failure(tmp_path: Path) -> None:
    _trial(tmp_path, "t0")
    assert trials_dir(tmp_path) == tmp_path / "trials"
    assert trials_dir(tmp_path / "trials") == tmp_path / "trials"
    with pytest.raises(FileNotFoundError, match=r"expected .*trials/<trial_name>/trial\.json"):
        trials_dir(tmp_path / "trials" / "t0")


def test_diverged_flag_from_status(tmp_path: Path) -> None:
    _trial(tmp_path, "d", status="diverged", diverged=False, diverged_reason="nan loss")
    trials = load_experiment(tmp_path).trials
    assert bool(trials["diverged"].iloc[0]) is True
    assert isinstance(trials, pd.DataFrame)


def test_trial_without_evals_is_listed(tmp_path: Path) -> None:
    trial = _trial(tmp_path, "no-evals")
    _part(
        trial / "metrics.parquet" / "part-000000.parquet",
        {mn.STEP: [0, 1], mn.REWARD_MEAN: [0.1, 0.2]},
    )
    problems = load_experiment(tmp_path).problems
    assert f"no {mn.EVAL_PASS_RATE} values: not scored" in problems["problem"].tolist()


def test_invalid_record_is_a_problem_naming_file_and_field(tmp_path: Path) -> None:
    _trial(tmp_path, "good")
    bad = _trial(tmp_path, "no-mode")
    info = json.loads((bad / "trial.json").read_text())
    del info["mode"]
    (bad / "trial.json").write_text(json.dumps(info))
    experiment = load_experiment(tmp_path)  # collects, never raises
    assert experiment.trials["trial_name"].tolist() == ["good"]
    row = experiment.problems.set_index("trial_name").loc["no-mode"]
    assert row["status"] == "unreadable"
    assert str(bad / "trial.json") in row["problem"] and "mode: Field required" in row["problem"]


def test_each_trial_states_its_staleness_policy(tmp_path: Path) -> None:
    """Mode and lag from trial.json, partial rollouts and the weight-sync interval from the
    resolved config: the trial's arm's own `staleness` fields where set, else the experiment's
    (absent or at their defaults: none, every step); the Trials section says which policies
    ran, counted."""
    _trial(tmp_path, "a")
    (_trial(tmp_path, "b", mode="bounded", lag=2) / "resolved_config.yaml").write_text(
        "staleness:\n  mode: bounded\n  lags: [2]\n  sync_every: 3\n"
    )
    (_trial(tmp_path, "c", lag=1) / "resolved_config.yaml").write_text("staleness: {lags: [1]}\n")
    own = (
        "staleness: {mode: bounded, lags: [1], sync_every: 3}\n"
        "arms:\n  - {name: gspo, objective: gspo, staleness: {partial_rollouts: true, "
        "sync_every: 2}}\n  - {name: grpo, objective: grpo}\n"
    )
    (_trial(tmp_path, "d", mode="bounded", lag=1) / "resolved_config.yaml").write_text(own)
    (_trial(tmp_path, "e", mode="bounded", lag=1, arm="grpo") / "resolved_config.yaml").write_text(
        own
    )
    trials = load_experiment(tmp_path).trials.set_index("trial_name")
    assert trials["policy"].to_dict() == {
        "a": "fixed lag 0",
        "b": "bounded, max lag 2, weights synced every 3 steps",
        "c": "fixed lag 1",
        "d": "bounded, max lag 1, partial rollouts, weights synced every 2 steps",
        "e": "bounded, max lag 1, weights synced every 3 steps",
    }
    line = policy_line(trials.reset_index())
    assert line == (
        "Staleness policies: bounded, max lag 1, partial rollouts, weights synced every 2 "
        "steps (1 trial); bounded, max lag 1, weights synced every 3 steps (1 trial); bounded, "
        "max lag 2, weights synced every 3 steps (1 trial); fixed lag 0 (1 trial); fixed lag 1 "
        "(1 trial)."
    )


def test_a_recorded_regime_is_read_from_the_record_not_the_resolved_config(
    tmp_path: Path,
) -> None:
    """A record that carries its regime (`TrialRegime`, written when the trial is prepared) is
    the one source: a resolved config that says otherwise is not read."""
    regime = {
        "mode": "bounded",
        "lag": 2,
        "partial_rollouts": True,
        "sync_every": 2,
        "correction": "tis_token",
    }
    trial = _trial(tmp_path, "a", mode="bounded", lag=2, regime=regime)
    (trial / "resolved_config.yaml").write_text(
        "staleness: {mode: bounded, lags: [2], sync_every: 5}\n"
        "arms:\n  - {name: gspo, objective: gspo, correction: icepop}\n"
    )
    row = load_experiment(tmp_path).trials.set_index("trial_name").loc["a"]
    assert row["policy"] == "bounded, max lag 2, partial rollouts, weights synced every 2 steps"
    assert row["correction"] == "tis_token"
