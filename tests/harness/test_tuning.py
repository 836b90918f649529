"""The tuning protocol (harness.config.tuning, harness.experiment.tuning): its config rules, the
two stage configs, the selection, and `harness run` through both stages on real processes (the
fake trial runner, whose validation score depends on the arm's lr), MLflow, kills and resumes."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient
from rich.console import Console

from contract.layout import TUNING_SCORES, TUNING_SELECTION
from contract.tuning import TuningSelection
from harness.config import (
    ConfigError,
    ExperimentConfig,
    load_config,
    resolved_dump,
    validate_config,
)
from harness.config.tuning import SearchSpace, tuned_arm_name
from harness.experiment.request import ExperimentRequest
from harness.experiment.tuning import (
    check_validation_is_held_out,
    final_stage_config,
    run_tuned_experiment,
    select_configurations,
    tuning_stage_config,
)
from tests.harness.mlflow_store import fresh_sqlite_store, template_store
from tests.harness.test_experiment import FAKE_PREFIX
from tests.harness.trial_helpers import REPO

LRS = [1e-5, 1e-4, 1e-3, 1e-2]


def tuned_data(root: Path, lrs: list[float] = LRS, **extra: object) -> dict:
    """GSPO vs GRPO, each with one configuration per learning rate in `lrs` x 2 tuning seeds,
    selected on `val`."""
    data = {
        "name": "tuned",
        "seeds": [0, 1],
        "arms": [{"name": "gspo", "objective": "gspo"}, {"name": "grpo", "objective": "grpo"}],
        "evals": [
            {"name": "test"},
            {"name": "val", "task": {"name": "addition", "eval_size": 16, "eval_offset": 64}},
        ],
        "output_dir": str(root),
        "learner": {"steps": 4, "eval_every": 2},
        "tracking": {"enabled": False},
        "tuning": {
            "seeds": [100, 101],
            "budget": len(lrs),
            "validation": "val",
            "space": {"gspo": {"grid": {"lr": lrs}}, "grpo": {"grid": {"lr": lrs}}},
        },
    }
    return data | extra


def refused(data: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        validate_config(data)
    return str(caught.value)


# ---- the config's rules ---------------------------------------------------------------------


def test_tuning_and_evaluation_seeds_never_overlap(tmp_path: Path) -> None:
    data = tuned_data(tmp_path)
    data["tuning"]["seeds"] = [1, 100]
    assert "tuning.seeds and seeds share [1]" in refused(data)


def test_the_validation_set_is_an_eval_set_other_than_the_test_set(tmp_path: Path) -> None:
    data = tuned_data(tmp_path)
    data["tuning"]["validation"] = "test"
    assert "tuning.validation='test' is the first eval set, the test set" in refused(data)
    data["tuning"]["validation"] = "nope"
    assert "tuning.validation='nope' is not an eval set; the eval sets are ['test', 'val']" in (
        refused(data)
    )


def test_every_arm_gets_the_same_budget_refused_by_name_otherwise(tmp_path: Path) -> None:
    data = tuned_data(tmp_path)
    data["tuning"]["space"]["grpo"] = {"grid": {"lr": LRS[:3]}}
    assert "tuning.space.grpo: its grid has 3 configurations, but tuning.budget is 4" in (
        refused(data)
    )
    del data["tuning"]["space"]["grpo"]
    assert "missing ['grpo']" in refused(data)
    data["tuning"]["space"]["grpo"] = {"grid": {"lr": LRS}}
    data["tuning"]["space"]["ppo"] = {"grid": {"lr": LRS}}
    assert "not arms ['ppo']" in refused(data)


def test_a_configuration_the_arm_cannot_take_is_refused_by_name(tmp_path: Path) -> None:
    data = tuned_data(tmp_path)
    data["tuning"]["space"]["grpo"] = {"grid": {"lr": LRS[:2], "tau_pos": [1.0, 2.0]}}
    message = refused(data)
    assert "tuning.space.grpo configuration 0 {'lr': 1e-05, 'tau_pos': 1.0}" in message
    assert "tau_pos" in message


def test_random_draws_are_seeded_per_arm_and_fill_the_budget() -> None:
    space = SearchSpace.model_validate(
        {"random": {"lr": {"log_uniform": [1e-5, 1e-2]}, "minibatches": {"choice": [1, 2]}}}
    )
    first = space.configurations("grpo", 5, seed=3)
    assert first == space.configurations("grpo", 5, seed=3)  # every launch draws the same
    assert first != space.configurations("gspo", 5, seed=3)  # an arm's own stream
    assert len(first) == 5 and space.size(5) == 5
    assert all(1e-5 <= c["lr"] <= 1e-2 and c["minibatches"] in (1, 2) for c in first)
    grid = SearchSpace.model_validate({"grid": {"lr": [1, 2], "beta": [0.0, 0.1]}})
    assert grid.configurations("a", 4, 0) == [
        {"lr": 1, "beta": 0.0},
        {"lr": 1, "beta": 0.1},
        {"lr": 2, "beta": 0.0},
        {"lr": 2, "beta": 0.1},
    ]
    with pytest.raises(ValueError, match="exactly one of uniform"):
        SearchSpace.model_validate({"random": {"lr": {"uniform": [0, 1], "choice": [1]}}})


def test_a_config_without_tuning_keeps_its_hash(tmp_path: Path) -> None:
    data = tuned_data(tmp_path)
    del data["tuning"]
    plain = validate_config(data)
    assert "tuning" not in resolved_dump(plain) and "selection" not in resolved_dump(plain)
    # eval_offset 0 is left out of the task's resolved form too
    assert "eval_offset" not in resolved_dump(plain.task)


# ---- the two stages and the selection --------------------------------------------------------


def test_the_tuning_stage_trains_every_configuration_on_the_tuning_seeds_on_validation(
    tmp_path: Path,
) -> None:
    cfg = validate_config(tuned_data(tmp_path))
    stage = tuning_stage_config(cfg)
    assert [a.name for a in stage.arms] == [
        *(tuned_arm_name("gspo", i) for i in range(4)),
        *(tuned_arm_name("grpo", i) for i in range(4)),
    ]
    assert [stage.arm(tuned_arm_name("grpo", i)).lr for i in range(4)] == LRS
    assert stage.seeds == [100, 101] and stage.tuning is None
    assert [name for name, _ in stage.eval_sets()] == ["val"]  # the only, hence primary, set


def test_the_validation_set_never_reaches_the_final_stage(tmp_path: Path) -> None:
    cfg = validate_config(tuned_data(tmp_path))
    check_validation_is_held_out(cfg)  # offset 64 = past the test set's 64 prompts
    final = final_stage_config(cfg, _selection(cfg, {"gspo": 2, "grpo": 1}))
    assert [name for name, _ in final.eval_sets()] == ["test"]
    assert final.seeds == [0, 1]
    assert (final.arm("gspo").lr, final.arm("grpo").lr) == (1e-3, 1e-4)
    other = final_stage_config(cfg, _selection(cfg, {"gspo": 2, "grpo": 2}))
    assert other.config_hash() != final.config_hash()  # the hash records what was selected
    leaking = tuned_data(tmp_path)
    leaking["evals"][1]["task"]["eval_offset"] = 60
    with pytest.raises(ConfigError, match="shares 4 prompt\\(s\\) with eval set 'test'"):
        check_validation_is_held_out(validate_config(leaking))


def _selection(cfg: ExperimentConfig, picks: dict[str, int]) -> TuningSelection:
    rows = [
        {"arm": arm, "config": i, "seed": s, "score": 1.0 if i == picks[arm] else 0.5}
        for arm in picks
        for i in range(4)
        for s in (100, 101)
    ]
    return select_configurations(cfg, pd.DataFrame(rows))


def test_selection_takes_the_best_mean_over_finished_seeds_and_the_first_of_ties(
    tmp_path: Path,
) -> None:
    cfg = validate_config(tuned_data(tmp_path))
    scores = {  # (config, seed) -> score; NaN: that tuning trial did not finish
        (0, 100): 0.2, (0, 101): 0.4,
        (1, 100): 0.5, (1, 101): math.nan,
        (2, 100): 0.3, (2, 101): 0.7,
        (3, 100): 0.6, (3, 101): 0.4,
    }  # fmt: skip
    rows = [
        {"arm": arm, "config": c, "seed": s, "score": v}
        for arm in ("gspo", "grpo")
        for (c, s), v in scores.items()
    ]
    selection = select_configurations(cfg, pd.DataFrame(rows))
    grpo = selection.arms["grpo"]
    assert [c.score for c in grpo.configs] == pytest.approx([0.3, 0.5, 0.5, 0.5])
    assert [c.n_seeds for c in grpo.configs] == [2, 1, 2, 2]
    assert grpo.selected == 1 and grpo.settings == {"lr": 1e-4}  # first of the ties
    assert selection.seeds == [100, 101] and selection.evaluation_seeds == [0, 1]
    assert selection.validation.model_dump() == {
        "name": "val", "task": "addition", "offset": 64, "size": 16
    }  # fmt: skip
    nothing = pd.DataFrame([{**r, "score": math.nan} for r in rows])
    with pytest.raises(ConfigError, match="no configuration of arm 'gspo' has a validation"):
        select_configurations(cfg, nothing)


# ---- harness run, both stages, on real processes ----------------------------------------------


@pytest.fixture(scope="module")
def mlflow_template(request: pytest.FixtureRequest, tmp_path_factory) -> Path:
    return template_store(request.config, tmp_path_factory)


# The launches use two learning rates: 2 arms x 2 configurations x 2 tuning seeds + 4 final
# trials, the smallest grid where a selection and a resume mean something.
RUN_LRS = [1e-4, 1e-3]


def launch(root: Path, uri: str | None = None, *, report: bool = False, **env: str):
    data = tuned_data(root, RUN_LRS)
    if uri is not None:
        data["tracking"] = {"enabled": True, "tracking_uri": uri}
    root.mkdir(parents=True, exist_ok=True)
    path = root / "tuned.yaml"
    path.write_text(json.dumps(data))
    cfg = load_config(path)
    saved = {k: os.environ.get(k) for k in ("FAKE_LR_SCORES", "FAKE_FAIL_ARMS")}
    os.environ.update({"FAKE_LR_SCORES": "1", "FAKE_FAIL_ARMS": "", **env})
    try:
        return run_tuned_experiment(
            ExperimentRequest(cfg, path, root / "out", max_parallel=4),
            console=Console(file=io.StringIO()), command_prefix=FAKE_PREFIX, report=report,
        )  # fmt: skip
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def attempts(trial_dir: Path) -> int:
    path = trial_dir / "attempts.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def trial_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


@pytest.mark.e2e  # both stages of `harness run`, trials as processes
def test_harness_run_tunes_selects_and_compares_under_one_mlflow_parent(
    tmp_path: Path, mlflow_template: Path
) -> None:
    uri = fresh_sqlite_store(tmp_path / "store", mlflow_template)
    result = launch(tmp_path, uri, report=True)
    assert result.exit_code == 0, result.report_error
    out = tmp_path / "out"
    tuning = trial_dirs(out / "tuning" / "trials")
    final = trial_dirs(out / "trials")
    assert len(tuning) == 2 * 2 * 2 and len(final) == 2 * 2
    assert {p.name.split("__")[1] for p in tuning} == {"seed100", "seed101"}
    assert {p.name.split("__")[1] for p in final} == {"seed0", "seed1"}
    # the validation set is the tuning trials' only set and never a final trial's
    assert all(json.loads((p / "eval_sets.json").read_text())["eval_sets"] == ["val"]
               for p in tuning)  # fmt: skip
    assert all(json.loads((p / "eval_sets.json").read_text())["eval_sets"] == ["test"]
               for p in final)  # fmt: skip
    selection = json.loads((out / "tuning" / TUNING_SELECTION).read_text())
    for arm in ("gspo", "grpo"):  # lr 1e-3 scores best in the fake runner
        assert selection["arms"][arm]["selected"] == 1
        assert selection["arms"][arm]["settings"] == {"lr": 1e-3}
        # the report's final score (mean of the last 2 evals, steps 2 and 4: 0.1 and 0.2)
        # plus 0.001 x seed, averaged over seeds 100 and 101
        assert selection["arms"][arm]["score"] == pytest.approx(0.15 + 0.1005)
    scores = pd.read_parquet(out / "tuning" / TUNING_SCORES)
    assert len(scores) == 8 and list(scores.columns) == [
        "arm", "config", "seed", "score", "status", "param.lr",
    ]  # fmt: skip
    stage_cfg = load_config(out / "stage_config.yaml")
    assert stage_cfg.selection is not None
    assert stage_cfg.arm("gspo").lr == 1e-3 and stage_cfg.selection.arms["gspo"].selected == 1
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs(client.get_experiment_by_name("tuned").experiment_id)
    parents = [r for r in runs if r.data.tags.get("harness.kind") == "experiment"]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    stages = sorted(r.data.tags.get("harness.stage") for r in children)
    assert stages == ["final"] * 4 + ["tuning"] * 8
    assert parents[0].data.tags["tuning.selected.grpo"] == "1"
    artifacts = [a.path for a in client.list_artifacts(parents[0].info.run_id, "tuning")]
    assert artifacts == ["tuning/selection.json"]


@pytest.mark.e2e  # both stages of `harness run`, trials as processes
def test_a_failed_run_resumes_either_stage_without_rerunning_finished_trials(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    # the tuning stage fails (one configuration's trials): no selection, no final trials
    failed = launch(root, FAKE_FAIL_ARMS=tuned_arm_name("grpo", 0))
    assert failed.exit_code == 1
    out = root / "out"
    assert not (out / "tuning" / TUNING_SELECTION).exists() and not (out / "trials").exists()
    # resumed: only the failed configuration runs again; then a final arm fails
    failed = launch(root, FAKE_FAIL_ARMS="gspo")
    assert failed.exit_code == 1
    runs = {p.name: attempts(p) for p in trial_dirs(out / "tuning" / "trials")}
    assert all(n == (2 if name.startswith("grpo-c0") else 1) for name, n in runs.items())
    expected = json.loads((out / "tuning" / TUNING_SELECTION).read_text())
    assert {arm: e["selected"] for arm, e in expected["arms"].items()} == {"gspo": 1, "grpo": 1}
    # resumed again: tuning untouched, the selection identical, the failed final trials finish
    assert launch(root).exit_code == 0
    assert {p.name: attempts(p) for p in trial_dirs(out / "tuning" / "trials")} == runs
    assert json.loads((out / "tuning" / TUNING_SELECTION).read_text()) == expected
    final = {p.name: attempts(p) for p in trial_dirs(out / "trials")}
    assert all(n == (2 if name.startswith("gspo") else 1) for name, n in final.items())


@pytest.mark.e2e  # both stages of `harness run`, trials as processes
def test_a_killed_run_resumes_the_tuning_stage_and_selects_the_same(tmp_path: Path) -> None:
    """SIGTERM to `harness run` mid-tuning: trials stop, nothing is selected; the rerun runs only
    the unfinished tuning trials, then selects and compares as an uninterrupted run would."""
    driver = (
        "import sys; from pathlib import Path; from tests.harness.test_tuning import launch; "
        f"sys.exit(launch(Path({str(tmp_path)!r})).exit_code)"
    )
    env = {**os.environ, "FAKE_STEP_S": "0.3"}
    process = subprocess.Popen(
        [sys.executable, "-c", driver], cwd=REPO, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    trials = tmp_path / "out" / "tuning" / "trials"
    deadline = time.monotonic() + 120
    while not _completed(trials):
        assert time.monotonic() < deadline and process.poll() is None, "no tuning trial finished"
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    finished = _completed(trials)
    assert 0 < len(finished) < 8
    assert not (tmp_path / "out" / "tuning" / TUNING_SELECTION).exists()
    assert launch(tmp_path).exit_code == 0
    assert all(attempts(trials / name) == 1 for name in finished)
    selection = json.loads((tmp_path / "out" / "tuning" / TUNING_SELECTION).read_text())
    assert {arm: e["selected"] for arm, e in selection["arms"].items()} == {"gspo": 1, "grpo": 1}
    assert len(trial_dirs(tmp_path / "out" / "trials")) == 4


def _completed(trials: Path) -> set[str]:
    if not trials.exists():
        return set()
    done = set()
    for trial in trials.iterdir():
        record = trial / "trial.json"
        if record.exists() and '"status": "completed"' in record.read_text():
            done.add(trial.name)
    return done


def test_tuning_seeds_take_ranges_like_seeds(tmp_path: Path) -> None:
    data = tuned_data(tmp_path)
    data["tuning"]["seeds"] = "range(100,103)"
    assert validate_config(data).tuning.seeds == [100, 101, 102]
    data["tuning"]["seeds"] = [100, 100]
    assert "tuning.seeds has duplicates: [100, 100]" in refused(data)


@pytest.mark.parametrize(
    ("override", "out"),
    [({"executor": {"kind": "ray"}}, None), ({}, "s3://bucket/tuned")],
)
def test_a_tuned_run_on_ray_or_a_bucket_is_refused_in_one_line(
    tmp_path: Path, override: dict, out: str | None
) -> None:
    cfg = validate_config(tuned_data(tmp_path, **override))
    with pytest.raises(ConfigError, match=r"a tuning stage runs with executor\.kind=local"):
        run_tuned_experiment(
            ExperimentRequest(cfg, tmp_path / "tuned.yaml", out),
            console=Console(file=io.StringIO()),
        )
