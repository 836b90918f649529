"""`harness run` with its output in a bucket (a real S3 endpoint: moto's server) and the local
executor: real trials, real Redis; the bucket alone must be enough to pick a run up elsewhere.

The Ray executor, where every component keeps its own working copy, is tested on a two-node
cluster in test_ray_executor.py. The plain-path reference is the session's shared
`gspo_two_seeds` experiment (tests/harness/conftest.py), whose seed-0 trial is this one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from contract.record import read_trial_record
from harness.config import load_config, load_config_data
from harness.experiment.run import ExperimentRequest, run_experiment
from harness.storage.remote_tree import RemoteTree
from harness.storage.trial_storage import Storage
from harness.trial.learner_main import FAULT_EXIT_AFTER_STEP_ENV
from tests.harness.shared_trials import GSPO_TWO_SEEDS
from tests.harness.trial_helpers import REPO, SMALL_FIXED, assert_same_metrics

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

STEPS = 4  # two checkpoints (learner.checkpoint_every=2)
TRIAL = "gspo__seed0__lag0__fixed"
BASE = [
    *SMALL_FIXED,
    "arms=[{name: gspo, objective: gspo}]",
    "seeds=[0]",
]
# The shared reference runs this configuration (plus seed 1) for STEPS steps, with cold component
# processes (the executor is not part of a config).
SHARED = (*BASE[:-1], "seeds=[0, 1]", "executor.warm_components=false")
assert GSPO_TWO_SEEDS.overrides == SHARED and GSPO_TWO_SEEDS.steps == STEPS


def _config(path: Path, scratch: Path) -> Path:
    data = load_config_data(REPO / "configs/quickstart.yaml", BASE)
    data["executor"] = {"scratch_dir": str(scratch), "sync_interval_s": 0.5}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(config: Path, out: str | Path, report: bool = False) -> Any:
    request = ExperimentRequest(load_config(config), config, out, (), 1, STEPS)
    return run_experiment(request, report=report)


@pytest.fixture
def reference(gspo_two_seeds: Path) -> Path:
    """The same trial with its output on a plain path (shared, read-only)."""
    return gspo_two_seeds / "trials" / TRIAL


def test_a_bucket_run_matches_a_path_run_and_a_new_machine_adopts_it(
    tmp_path: Path, s3_uri: str, reference: Path
) -> None:
    """Same metrics as on a path; the bucket holds the trial, its checkpoints and weights and
    the report; a launch with an empty scratch dir (another machine) finds everything done."""
    first = _run(_config(tmp_path / "a.yaml", tmp_path / "scratch-a"), s3_uri, report=True)
    assert first.exit_code == 0 and [t.status for t in first.trials] == ["completed"]
    working = Storage(s3_uri, tmp_path / "scratch-a").driver_dir()
    assert first.out_dir == working
    assert_same_metrics(reference, working / "trials" / TRIAL)

    files = RemoteTree.open(s3_uri).listing()
    trial = f"trials/{TRIAL}"
    for expected in (
        "resolved_config.yaml",
        "report/report.md",
        f"{trial}/trial.json",
        f"{trial}/trial.log",
        f"{trial}/prompts.parquet",
        f"{trial}/learner_outcome.json",
        f"{trial}/checkpoints/latest.json",
        f"{trial}/metrics.parquet/part-{STEPS:06d}.parquet",
        f"{trial}/trained_groups/step-{STEPS:06d}.json",
        f"{trial}/weights/v{STEPS:06d}/model.safetensors",
        f"{trial}/logs/learner.log",
    ):
        assert expected in files, f"{expected} not in the bucket"
    assert not any("/." in f or f.startswith(".") for f in files)  # no lock or temp files

    again = _run(_config(tmp_path / "b.yaml", tmp_path / "scratch-b"), s3_uri, report=True)
    assert again.exit_code == 0
    assert [t.status for t in again.trials] == ["completed"]
    restored = Storage(s3_uri, tmp_path / "scratch-b").driver_dir() / "trials" / TRIAL
    assert read_trial_record(restored).steps_completed == STEPS
    assert_same_metrics(reference, restored)
    assert (again.out_dir / "report/report.md").is_file()


def test_a_trial_failed_on_one_machine_resumes_from_the_bucket_on_another(
    tmp_path: Path, s3_uri: str, reference: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The learner dies after step 3 (checkpoint at 2); the launch's working copy is then
    deleted. A launch on a fresh scratch dir restores checkpoint, ledger and Redis' AOF from
    the bucket and resumes: fixed mode ends bitwise where the uninterrupted run ended, and
    every group was trained once."""
    monkeypatch.setenv(FAULT_EXIT_AFTER_STEP_ENV, "3")
    failed = _run(_config(tmp_path / "a.yaml", tmp_path / "scratch-a"), s3_uri)
    assert [t.status for t in failed.trials] == ["failed"]
    shutil.rmtree(tmp_path / "scratch-a")
    monkeypatch.delenv(FAULT_EXIT_AFTER_STEP_ENV)

    resumed = _run(_config(tmp_path / "b.yaml", tmp_path / "scratch-b"), s3_uri)
    assert [t.status for t in resumed.trials] == ["completed"]
    trial_dir = resumed.out_dir / "trials" / TRIAL
    record = read_trial_record(trial_dir)
    assert record.resumed and record.steps_completed == STEPS
    assert_same_metrics(reference, trial_dir)
    bucket = RemoteTree.open(s3_uri).child(f"trials/{TRIAL}")
    ledger = sorted(rel for rel in bucket.listing("trained_groups"))
    assert ledger == [f"trained_groups/step-{k:06d}.json" for k in range(1, STEPS + 1)]
    steps = sorted((trial_dir / "trained_groups").glob("step-*.json"))
    groups = [g["group_id"] for path in steps for g in json.loads(path.read_text())]
    assert len(groups) == len(set(groups)) == STEPS * 4  # learner.prompts_per_step=4
