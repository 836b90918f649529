"""The compose topology on one machine: one Redis, two `harness generator`, one `harness learner`.

This is what `docker compose --scale generator=2` (or N machines pointed at one Redis URL) runs;
the test checks the work is shared and every group is trained exactly once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from buffer.server import EmbeddedRedis
from buffer.streams import Telemetry, connect
from learner.runtime.metrics_log import GroupLedger
from tests.harness.trial_helpers import REPO, SMALL

STEPS, PROMPTS_PER_STEP = 6, 4


def component(command: str, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "harness.cli", command, str(REPO / "configs/quickstart.yaml"),
        "--arm", "gspo", "--seed", "0", "--lag", "1", "--mode", "fixed",
        "--out", str(out), "--steps", str(STEPS), *extra,
        *SMALL, "generation.backend=torch", "generation.max_prompts_per_call=1",
    ]  # fmt: skip


@pytest.mark.e2e
def test_two_generators_one_learner_each_group_trained_once(tmp_path: Path) -> None:
    out = tmp_path / "trial"
    (tmp_path / "redis").mkdir()
    with EmbeddedRedis(tmp_path / "redis", appendfsync="everysec") as server:
        env = {**os.environ, "HARNESS_REDIS_URL": server.url, "HARNESS_RUN_ID": "scale-out"}
        generators = [
            subprocess.Popen(component("generator", out, "--id", name), env=env, cwd=REPO)
            for name in ("gen-a", "gen-b")
        ]
        # Both generators registered (and idle, waiting for v0) before the learner starts, so
        # the work is shared whichever process happened to start faster.
        with connect(server.url) as client:
            telemetry = Telemetry(client, "scale-out")
            deadline = time.monotonic() + 300
            while set(telemetry.generators()) != {"gen-a", "gen-b"}:
                assert time.monotonic() < deadline, "generators did not register"
                time.sleep(0.1)
        learner = subprocess.Popen(component("learner", out), env=env, cwd=REPO)
        try:
            assert learner.wait(timeout=600) == 0
            for generator in generators:
                assert generator.wait(timeout=120) == 0
        finally:
            for process in (learner, *generators):
                if process.poll() is None:
                    process.kill()
    rows = GroupLedger(out).read()
    ids = Counter(row["group_id"] for row in rows)
    assert len(ids) == STEPS * PROMPTS_PER_STEP and set(ids.values()) == {1}
    by_generator = Counter(row["generator_id"] for row in rows)
    assert set(by_generator) == {"gen-a", "gen-b"}, by_generator


def test_compose_file_validates() -> None:
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is missing; scripts/setup.sh installs Debian's package")
    result = subprocess.run(
        ["docker-compose", "-f", "docker/compose.yaml", "config", "-q"],
        cwd=REPO,
        env={**os.environ, "HARNESS_REDIS_PASSWORD": "test-password"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
