"""`harness run` end to end: 2 arms x 2 seeds with real trials, Redis and an MLflow store.

Read back with MlflowClient: one parent per launch, the right children and tags, metric
histories of the expected length, equal prompt-dataset digests for matched arms, the report on
the parent. A second launch after an interruption runs only the missing trials. The output
directory starts with an empty, migrated store (a copy of the session's template: `harness run`
opens it as it would its own new one, without paying for the migrations again).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.harness.mlflow_store import fresh_sqlite_store, template_store
from tests.harness.trial_helpers import REPO, SMALL

pytestmark = pytest.mark.e2e

STEPS = 2
OVERRIDES = [
    *SMALL,
    "generation.backend=torch",
    "arms=[{name: gspo, objective: gspo}, {name: grpo, objective: grpo}]",
    "seeds=[0, 1]",
    "staleness.lags=[0]",
    "report.n_resamples=2000",
]


def harness_run(out: Path) -> list[str]:
    return [
        sys.executable, "-m", "harness.cli", "run", str(REPO / "configs/quickstart.yaml"),
        "--out", str(out), "--steps", str(STEPS), *OVERRIDES,
    ]  # fmt: skip


def trial_infos(out: Path) -> dict[str, dict]:
    return {
        path.parent.name: json.loads(path.read_text())
        for path in sorted((out / "trials").glob("*/trial.json"))
    }


@pytest.mark.slow
def test_mini_experiment_tracks_everything_and_resumes(
    tmp_path: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = tmp_path / "exp"
    fresh_sqlite_store(out, template_store(request.config, tmp_path_factory))
    # First launch: interrupt it once the first trial has completed.
    process = subprocess.Popen(
        harness_run(out), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        infos = trial_infos(out) if (out / "trials").exists() else {}
        if any(info["status"] == "completed" for info in infos.values()):
            break
        assert process.poll() is None, "harness run ended before any trial completed"
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) != 0
    finished_first = {
        name: info["finished_at"]
        for name, info in trial_infos(out).items()
        if info["status"] == "completed"
    }
    assert 1 <= len(finished_first) < 4

    # Second launch: only the missing trials run; completed ones are untouched.
    second = subprocess.run(
        harness_run(out), cwd=REPO, capture_output=True, text=True, timeout=900, check=False
    )
    assert second.returncode == 0, second.stdout + second.stderr
    infos = trial_infos(out)
    assert len(infos) == 4 and all(info["status"] == "completed" for info in infos.values())
    for name, finished_at in finished_first.items():
        assert infos[name]["finished_at"] == finished_at

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("quickstart")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    live = [r for r in runs if r.data.tags.get("harness.superseded") != "true"]
    children = [r for r in live if "mlflow.parentRunId" in r.data.tags]
    parents = [r for r in live if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 2  # one per launch
    latest = max(parents, key=lambda r: r.info.start_time)
    assert len(children) == 4
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {latest.info.run_id}
    assert {(r.data.tags["arm"], r.data.tags["seed"]) for r in children} == {
        ("gspo", "0"), ("gspo", "1"), ("grpo", "0"), ("grpo", "1"),
    }  # fmt: skip
    for run in children:
        assert run.data.tags["status"] == "completed"
        assert run.data.tags["diverged"] in ("False", "false")
        history = client.get_metric_history(run.info.run_id, "reward/mean")
        assert sorted(m.step for m in history) == list(range(1, STEPS + 1))
    digests: dict[str, set[str]] = {}
    for run in children:
        for dataset_input in run.inputs.dataset_inputs:
            digests.setdefault(run.data.tags["seed"], set()).add(dataset_input.dataset.digest)
    assert set(digests) == {"0", "1"}
    assert all(len(d) == 1 for d in digests.values())  # matched arms saw the same prompts
    assert digests["0"] != digests["1"]
    artifacts = {a.path for a in client.list_artifacts(latest.info.run_id, "report")}
    assert {"report/report.md", "report/report.html", "report/summary.parquet"} <= artifacts
    assert (out / "report" / "report.md").exists()
