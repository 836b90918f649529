"""Every component of a run starts from the same initial weights, or the run stops saying so.

A generator starts on its own copy of the model (v0 is never loaded from the weight store), so a
Ray node or a scale-out container that built or mounted a different model would sample from
another policy than the learner scores, and every ratio would be silently wrong. The learner
names the run's initial weights in Redis before it publishes v0; generators compare.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from buffer.connection import connect
from buffer.versions import InitialWeightsMismatchError, VersionRegistry
from contract.layout import TrialPaths
from contract.record import TrialRecord, write_trial_record
from harness.launch.processes import EXIT_NO_RESTART
from harness.models.model_dir import build_model_dir, weights_digest
from harness.trial.learner_main import name_initial_weights
from tests.conftest import RedisInstance
from tests.contract.test_record import RUNNER_RECORD
from tests.harness.test_model_factory import TASK, tiny
from tests.harness.trial_helpers import REPO, SMALL

RUN_ID = "run-initial-weights"
DIGEST_A, DIGEST_B = "a" * 64, "b" * 64


@pytest.fixture
def client(redis_server: RedisInstance):
    client = connect(redis_server.url)
    yield client
    client.close()


def test_the_learner_names_the_weights_and_a_matching_generator_passes(
    client: redis.Redis,
) -> None:
    versions = VersionRegistry(client, RUN_ID)
    versions.check_initial_weights(DIGEST_A, "generator g0")  # nothing named yet: no verdict
    versions.record_initial_weights(DIGEST_A, "the learner")
    versions.record_initial_weights(DIGEST_A, "the learner")  # a resumed learner, same model
    versions.check_initial_weights(DIGEST_A, "generator g0")


def test_a_different_model_is_refused_naming_both_digests(client: redis.Redis) -> None:
    versions = VersionRegistry(client, RUN_ID)
    versions.record_initial_weights(DIGEST_A, "the learner")
    with pytest.raises(InitialWeightsMismatchError, match=r"generator g0 .*bbbbbbbbbbbb.*aaaa"):
        versions.check_initial_weights(DIGEST_B, "generator g0")
    with pytest.raises(InitialWeightsMismatchError, match="the learner"):
        versions.record_initial_weights(DIGEST_B, "the learner")  # resumed on another model


def test_the_learner_refuses_a_model_other_than_the_trial_was_prepared_with(
    client: redis.Redis, tmp_path: Path
) -> None:
    model_dir = build_model_dir(tiny(tmp_path / "cache"), TASK)
    paths = TrialPaths(tmp_path / "trial")
    paths.root.mkdir()
    record = TrialRecord.model_validate({**RUNNER_RECORD, "initial_weights_digest": DIGEST_B})
    write_trial_record(paths.root, record)
    versions = VersionRegistry(client, RUN_ID)
    with pytest.raises(InitialWeightsMismatchError, match=r"prepared with bbbbbbbbbbbb"):
        name_initial_weights(versions, paths, model_dir)
    assert versions.initial_weights_named() is None  # refused before naming anything

    write_trial_record(
        paths.root, record.model_copy(update={"initial_weights_digest": weights_digest(model_dir)})
    )
    name_initial_weights(versions, paths, model_dir)
    assert versions.initial_weights_named() == weights_digest(model_dir)


@pytest.mark.e2e
def test_a_generator_process_on_another_model_exits_without_restart(
    redis_server: RedisInstance, tmp_path: Path
) -> None:
    """The real generator command, against a run whose learner named other weights."""
    with connect(redis_server.url) as setup:
        versions = VersionRegistry(setup, RUN_ID)
        versions.record_initial_weights(DIGEST_A, "the learner")
        versions.publish(0, str(tmp_path / "weights" / "v000000"))
    command = [
        sys.executable, "-m", "harness.cli", "generator", str(REPO / "configs/quickstart.yaml"),
        "--arm", "gspo", "--seed", "0", "--lag", "0", "--out", str(tmp_path / "trial"),
        "--id", "g0", *SMALL, "generation.backend=torch",
    ]  # fmt: skip
    env = {**os.environ, "HARNESS_REDIS_URL": redis_server.url, "HARNESS_RUN_ID": RUN_ID}
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == EXIT_NO_RESTART, done.stdout + done.stderr
    assert "generator g0 has initial weights" in done.stderr
    assert "started from aaaaaaaaaaaa" in done.stderr
    assert "Traceback" not in done.stderr
