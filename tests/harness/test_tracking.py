"""MLflow tracking against a real SQLite store: parent/child runs, metrics, datasets, files."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from mlflow import MlflowClient

from contract.layout import PARENT_TAG
from harness.config import ExperimentConfig
from harness.experiment.grid import classify_trials, expand_trials
from harness.experiment.mlflow_ui import UiError, ui_command, ui_store
from harness.experiment.request import ExperimentRequest
from harness.experiment.run_registry import REGISTRY_FILE, ChildRecord, store_key
from harness.experiment.tracking import MlflowTracker, artifact_location, resolve_tracking_uri
from harness.experiment.trial_runs import (
    flatten_params,
    metric_batches,
    prompt_set_digest,
)
from harness.launch.trials import PlannedTrial
from learner.runtime.metrics_log import MetricsLog
from tests.harness.mlflow_store import fresh_sqlite_store, template_store

STEPS = 5
REDIS_URL = "redis://:hunter2@10.0.0.5:6379/0"  # a password that must never reach MLflow
EVAL_EVERY = 2  # eval/pass_rate is NaN on odd steps: steps 2 and 4 carry a value


@pytest.fixture(scope="session")
def mlflow_template(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return template_store(request.config, tmp_path_factory)


def make_config(root: Path) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "track",
            "seeds": [0, 1],
            "arms": [{"name": "gspo", "objective": "gspo"}, {"name": "grpo", "objective": "grpo"}],
            "output_dir": str(root),
            "learner": {"steps": STEPS},
            "buffer": {"redis_url": REDIS_URL},
        }
    )


def prompts_frame(seed: int) -> pd.DataFrame:
    rows = [("train", i, f"{seed}+{i}=", str(seed + i)) for i in range(3)]
    return pd.DataFrame(rows, columns=["split", "index", "prompt", "ground_truth"])


def write_trial(trial_dir: Path, arm: str, seed: int, status: str = "completed") -> None:
    """A trial dir as the trial runner leaves it: metric parts, trial.json, prompts, log."""
    log = MetricsLog(trial_dir)
    for step in range(1, STEPS + 1):
        pass_rate = 0.1 * step if step % EVAL_EVERY == 0 else math.nan
        metrics = {"reward/mean": 0.2 * step, "eval/pass_rate": pass_rate}
        log.append(step, 1_700_000_000.0 + step, metrics)
    prompts_frame(seed).to_parquet(trial_dir / "prompts.parquet", index=False)
    (trial_dir / "trial.log").write_text("trial output\n")
    (trial_dir / "logs").mkdir(exist_ok=True)
    (trial_dir / "logs" / "learner.log").write_text("learner output\n")
    (trial_dir / "resolved_config.yaml").write_text(f"buffer:\n  redis_url: {REDIS_URL}\n")
    name = f"{arm}__seed{seed}__lag0__fixed"
    info = {
        "experiment": "track", "trial_name": name, "arm": arm, "objective": arm, "seed": seed,
        "lag": 0, "mode": "fixed", "status": status, "diverged": False, "diverged_reason": None,
        "steps_planned": STEPS, "steps_completed": STEPS, "config_hash": "h1",
        "initial_weights_digest": "w", "prompt_set_digest": f"p{seed}",
        "started_at": "2026-01-01T00:00:00+00:00", "finished_at": "2026-01-01T00:01:00+00:00",
        "provenance": {"git": {"commit": "abc123", "dirty": True}},
    }  # fmt: skip
    (trial_dir / "trial.json").write_text(json.dumps(info))


def single_trial_config(root: Path) -> ExperimentConfig:
    cfg = make_config(root)
    return cfg.model_copy(update={"seeds": [0], "arms": cfg.arms[:1]})


@dataclass
class Logged:
    """An experiment logged once (module scope: one SQLite store for all read-back tests)."""

    cfg: ExperimentConfig
    out_dir: Path
    client: MlflowClient
    experiment_id: str
    parent_run_id: str


def children_of(client: MlflowClient, experiment_id: str, parent: str) -> list:
    return client.search_runs([experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent}'")


@pytest.fixture(autouse=True)
def _no_ambient_tracking_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's $MLFLOW_TRACKING_URI must not redirect the tests to their server."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path) -> Logged:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        return _log_experiment(tmp_path_factory.mktemp("tracking"), mlflow_template)


def _log_experiment(root: Path, template: Path) -> Logged:
    cfg = make_config(root)
    out_dir = root / cfg.name
    specs = expand_trials(cfg, out_dir)
    for spec in specs:
        write_trial(spec.trial_dir, spec.arm, spec.seed)
    config_path = root / "track.yaml"
    config_path.write_text("name: track\n")
    fresh_sqlite_store(out_dir, template)
    tracker = MlflowTracker.open(cfg, out_dir)
    tracker.start_experiment(ExperimentRequest(cfg, config_path, overrides=["learner.lr=0.001"]))
    for trial in classify_trials(specs):
        tracker.trial_done_before(trial)
    tracker.end_experiment("FINISHED")
    assert tracker.parent_run_id is not None
    return Logged(cfg, out_dir, tracker.client, tracker.experiment_id, tracker.parent_run_id)


def test_store_is_local_sqlite_with_artifacts_in_out_dir(logged: Logged) -> None:
    assert logged.client.tracking_uri == f"sqlite:///{logged.out_dir / 'mlflow.db'}"
    experiment = logged.client.get_experiment(logged.experiment_id)
    assert experiment.name == "track"
    assert experiment.artifact_location == (logged.out_dir / "mlartifacts").as_uri()
    assert (logged.out_dir / REGISTRY_FILE).is_file()


def test_one_parent_with_config_params_and_provenance(logged: Logged) -> None:
    runs = logged.client.search_runs([logged.experiment_id])
    parents = [r for r in runs if PARENT_TAG not in r.data.tags]
    assert [p.info.run_id for p in parents] == [logged.parent_run_id]
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["config_hash"] == logged.cfg.config_hash()
    assert "git.dirty" in parent.data.tags
    assert parent.data.tags["pkg.mlflow"]
    assert json.loads(parent.data.tags["harness.overrides"]) == ["learner.lr=0.001"]
    assert parent.data.params["arms.gspo.objective"] == "gspo"
    assert parent.data.params["learner.steps"] == str(STEPS)
    assert parent.data.params["seeds"] == "[0, 1]"
    files = {f.path for f in logged.client.list_artifacts(logged.parent_run_id, "config")}
    assert "config/resolved_config.yaml" in files
    files = {f.path for f in logged.client.list_artifacts(logged.parent_run_id, "provenance")}
    assert files == {f"provenance/{k}.json" for k in ("packages", "hardware", "git")}


def test_children_have_grid_tags_and_status(logged: Logged) -> None:
    children = children_of(logged.client, logged.experiment_id, logged.parent_run_id)
    names = sorted(c.data.tags["trial_name"] for c in children)
    assert names == sorted(s.trial_name for s in expand_trials(logged.cfg, logged.out_dir))
    for child in children:
        tags = child.data.tags
        assert child.info.run_name == tags["trial_name"]
        assert tags["arm"] in ("gspo", "grpo")
        assert tags["seed"] in ("0", "1")
        assert (tags["lag"], tags["mode"]) == ("0", "fixed")
        assert (tags["status"], tags["diverged"]) == ("completed", "false")
        assert tags["config_hash"] == "h1"  # the trial's own hash, from trial.json
        assert tags["git.commit"] == "abc123"
        assert child.info.status == "FINISHED"
        # run times are the trial's own (trial.json), not when it was logged: 2026-01-01 UTC
        assert (child.info.start_time, child.info.end_time) == (1767225600000, 1767225660000)
        assert child.data.params["arm.objective"] == tags["arm"]
        assert child.data.params["steps"] == str(STEPS)


def test_metric_histories_have_one_point_per_logged_step(logged: Logged) -> None:
    for child in children_of(logged.client, logged.experiment_id, logged.parent_run_id):
        reward = logged.client.get_metric_history(child.info.run_id, "reward/mean")
        assert sorted(m.step for m in reward) == [1, 2, 3, 4, 5]
        # value at step 3 is 0.2 * 3; timestamp 1_700_000_003 s -> ms
        at3 = next(m for m in reward if m.step == 3)
        assert at3.value == pytest.approx(0.6, rel=1e-12)
        assert at3.timestamp == 1_700_000_003_000
        evals = logged.client.get_metric_history(child.info.run_id, "eval/pass_rate")
        assert sorted(m.step for m in evals) == [2, 4]  # NaN steps 1, 3, 5 skipped


def test_prompt_datasets_equal_within_a_seed(logged: Logged) -> None:
    digests: dict[str, set[str]] = {"0": set(), "1": set()}
    for child in children_of(logged.client, logged.experiment_id, logged.parent_run_id):
        inputs = logged.client.get_run(child.info.run_id).inputs.dataset_inputs
        assert len(inputs) == 1
        dataset = inputs[0].dataset
        seed = child.data.tags["seed"]
        assert dataset.name == f"prompts-seed{seed}"
        assert [(t.key, t.value) for t in inputs[0].tags] == [("mlflow.data.context", "train")]
        digests[seed].add(dataset.digest)
    assert len(digests["0"]) == 1 and len(digests["1"]) == 1  # both arms of a seed share it
    assert digests["0"] != digests["1"]
    assert digests["0"] == {prompt_set_digest(prompts_frame(0))}


def test_trial_files_are_artifacts(logged: Logged) -> None:
    child = children_of(logged.client, logged.experiment_id, logged.parent_run_id)[0]
    run_id = child.info.run_id
    top = {f.path for f in logged.client.list_artifacts(run_id, "trial")}
    assert {"trial/trial.json", "trial/trial.log", "trial/prompts.parquet"} <= top
    logs = {f.path for f in logged.client.list_artifacts(run_id, "trial/logs")}
    assert logs == {"trial/logs/learner.log"}
    parts = {f.path for f in logged.client.list_artifacts(run_id, "trial/metrics.parquet")}
    assert parts == {f"trial/metrics.parquet/part-{s:06d}.parquet" for s in range(1, STEPS + 1)}


def test_relaunch_reuses_children_under_the_new_parent(logged: Logged) -> None:
    specs = expand_trials(logged.cfg, logged.out_dir)
    before = {c.info.run_id for c in logged.client.search_runs([logged.experiment_id])}
    tracker = MlflowTracker.open(logged.cfg, logged.out_dir)
    tracker.start_experiment(ExperimentRequest(logged.cfg, logged.out_dir / "none.yaml"))
    for trial in classify_trials(specs):
        tracker.trial_done_before(trial)
    tracker.end_experiment("FINISHED")
    new_parent = tracker.parent_run_id
    runs = logged.client.search_runs([logged.experiment_id])
    parents = [r for r in runs if PARENT_TAG not in r.data.tags]
    children = [r for r in runs if PARENT_TAG in r.data.tags]
    assert len(parents) == 2 and len(children) == len(specs)
    assert {c.info.run_id for c in children} <= before  # no child was created again
    assert {c.data.tags[PARENT_TAG] for c in children} == {new_parent}
    new = next(p for p in parents if p.info.run_id == new_parent)
    assert json.loads(new.data.tags["harness.previous_parent_run_ids"]) == [logged.parent_run_id]
    history = logged.client.get_metric_history(children[0].info.run_id, "reward/mean")
    assert len(history) == STEPS  # not logged twice


def first_attempt(
    tmp_path: Path, mlflow_template: Path, on_disk: str, ended: str, reason: str
) -> tuple[MlflowTracker, PlannedTrial, ChildRecord | None]:
    """A one-trial run whose first attempt left status `on_disk` and was tracked as `ended`.

    Returns the tracker, the trial and the child run the registry holds for it.
    """
    cfg = single_trial_config(tmp_path)
    out_dir = tmp_path / cfg.name
    (spec,) = expand_trials(cfg, out_dir)
    write_trial(spec.trial_dir, spec.arm, spec.seed, status=on_disk)
    fresh_sqlite_store(out_dir, mlflow_template)
    tracker = MlflowTracker.open(cfg, out_dir)
    tracker.start_experiment(ExperimentRequest(cfg, tmp_path / "x.yaml"))
    tracker.trial_started(spec, resume=False)
    tracker.trial_ended(spec, ended, reason)
    return tracker, spec, tracker.registry.child(spec.trial_name)


def test_rerun_of_failed_trial_replaces_its_child(tmp_path: Path, mlflow_template: Path) -> None:
    tracker, spec, first = first_attempt(
        tmp_path, mlflow_template, "failed", "failed", "exit code 3"
    )
    assert first is not None and first.metrics_logged
    run = tracker.client.get_run(first.run_id)
    assert (run.info.status, run.data.tags["status"]) == ("FAILED", "failed")

    tracker.trial_started(spec, resume=True)  # the resumed attempt recomputes some steps
    write_trial(spec.trial_dir, spec.arm, spec.seed, status="completed")
    tracker.trial_ended(spec, "completed", "completed")
    second = tracker.registry.child(spec.trial_name)
    assert second is not None and second.run_id != first.run_id
    old = tracker.client.get_run(first.run_id)
    assert old.info.lifecycle_stage == "deleted" and old.data.tags["harness.superseded"] == "true"
    live = tracker.client.search_runs(
        [tracker.experiment_id], f"tags.trial_name = '{spec.trial_name}'"
    )
    assert [r.info.run_id for r in live] == [second.run_id]
    assert live[0].info.status == "FINISHED"


def test_interrupted_trial_keeps_its_child_for_the_resume(
    tmp_path: Path, mlflow_template: Path
) -> None:
    tracker, spec, first = first_attempt(
        tmp_path, mlflow_template, "running", "interrupted", "stopped"
    )
    assert first is not None and not first.metrics_logged
    assert tracker.client.get_run(first.run_id).info.status == "KILLED"
    assert tracker.client.get_metric_history(first.run_id, "reward/mean") == []
    tracker.trial_started(spec, resume=True)
    assert tracker.client.get_run(first.run_id).info.status == "RUNNING"
    tracker.trial_ended(spec, "completed", "completed")
    assert tracker.registry.child(spec.trial_name).run_id == first.run_id


def test_url_passwords_are_redacted_everywhere(logged: Logged, tmp_path: Path) -> None:
    parent = logged.client.get_run(logged.parent_run_id)
    assert parent.data.params["buffer.redis_url"] == "redis://:***@10.0.0.5:6379/0"
    runs = logged.client.search_runs([logged.experiment_id])
    child = next(r for r in runs if PARENT_TAG in r.data.tags)  # any child, whichever parent
    for run_id, artifact in [
        (logged.parent_run_id, "config/resolved_config.yaml"),
        (child.info.run_id, "trial/resolved_config.yaml"),
    ]:
        local = Path(logged.client.download_artifacts(run_id, artifact, str(tmp_path)))
        text = local.read_text()
        assert "hunter2" not in text and "redis://:***@10.0.0.5:6379/0" in text


def test_flatten_params_names_list_items_and_clips_long_values() -> None:
    flat = flatten_params(
        {"arms": [{"name": "a", "eps": 0.2}], "seeds": [0, 1], "x": {"y": None}, "s": "v" * 7000}
    )
    assert flat["arms.a.eps"] == "0.2"
    assert flat["arms.a.name"] == "a"
    assert flat["seeds"] == "[0, 1]"
    assert flat["x.y"] == "null"
    assert len(flat["s"]) == 6000 and flat["s"].endswith("...[truncated]")


def test_metric_batches_chunk_at_1000_and_skip_nan() -> None:
    steps = list(range(600))
    table = pa.table(
        {
            "step": pa.array(steps, pa.int64()),
            "timestamp": pa.array([float(s) for s in steps]),
            "a": pa.array([1.0] * 600),
            "b": pa.array([math.nan if s % 2 else 2.0 for s in steps]),
        }
    )
    batches = list(metric_batches(table, now_ms=0))
    # 600 values of `a` + 300 non-NaN values of `b` = 900 -> one batch; check the limit with 2x
    assert [len(b) for b in batches] == [900]
    doubled = pa.concat_tables([table, table])
    assert [len(b) for b in metric_batches(doubled, now_ms=0)] == [1000, 800]
    assert batches[0][1].timestamp == 1000 and batches[0][1].step == 1


def test_tracking_uri_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_config(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri(cfg, tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert resolve_tracking_uri(cfg, tmp_path) == "http://127.0.0.1:5000"
    cfg.tracking.tracking_uri = "sqlite:////data/x/m.db"
    assert resolve_tracking_uri(cfg, tmp_path) == "sqlite:////data/x/m.db"
    assert artifact_location("sqlite:////data/x/m.db") == "file:///data/x/mlartifacts"
    assert artifact_location("http://127.0.0.1:5000") is None


def test_registry_never_stores_credentials() -> None:
    assert store_key("https://user:secret@mlflow.example:8443/x") == "https://mlflow.example:8443/x"
    assert store_key("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"


def test_ui_store_and_command(tmp_path: Path) -> None:
    with pytest.raises(UiError, match="no MLflow store"):
        ui_store(tmp_path)
    (tmp_path / "mlflow.db").write_bytes(b"")
    backend, artifacts = ui_store(tmp_path)
    assert backend == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert artifacts == (tmp_path.resolve() / "mlartifacts").as_uri()
    argv = ui_command(backend, artifacts, 5123)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "5123"
    assert argv[argv.index("--default-artifact-root") + 1] == artifacts
