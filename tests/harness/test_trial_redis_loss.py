"""Whole trials whose Redis dies or comes back empty: the trial fails within seconds, and
trial.json's failure reason quotes one line saying what happened and what to do (issue 19, 6).

Each used to end differently: a resume with AOF off, and a Redis restarted empty mid-trial, hung
until the learner's 600 s take timeout; a Redis death showed as a learner traceback.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from contract.record import read_trial_record
from tests.conftest import RedisInstance
from tests.harness.trial_helpers import REPO, run_trial, status, trial_command, wait_for_step

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

LOST = "Redis lost run"
# Far below the 600 s take timeout a hang ends with; covers model loading on a busy machine.
PROMPT_S = 120.0


def _failure_reason(out: Path) -> str:
    record = read_trial_record(out)
    assert record is not None and record.status.value == "failed"
    return record.failure_reason or ""


def _learner_error(out: Path) -> str:
    """The learner log's last line, which must be its one-line error, with no traceback above."""
    log = (out / "logs" / "learner.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    return log.strip().splitlines()[-1]


def test_resume_with_aof_off_fails_at_once_saying_to_rerun(tmp_path: Path) -> None:
    aof_off = ("buffer.appendfsync=off",)
    first = run_trial(tmp_path, "grpo", steps=2, extra=aof_off)
    assert first.returncode == 0, first.stdout + first.stderr
    started = time.monotonic()
    # The embedded Redis of the resume starts empty: no AOF to reload.
    resumed = run_trial(tmp_path, "grpo", steps=4, resume=True, extra=aof_off)
    assert time.monotonic() - started < PROMPT_S
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert LOST in _failure_reason(tmp_path)
    line = _learner_error(tmp_path)
    assert line.startswith(f"error: {LOST}") and "rerun the trial without --resume" in line
    assert "the learner's checkpoint of step 2 came after v2" in line


def _run_until_step_one(out: Path, url: str) -> subprocess.Popen:
    """Start a 20-step trial on the external Redis at `url`; return once step 1 is logged.

    `out` must not hold the Redis's data dir: a fresh trial clears `<out>/redis`."""
    process = subprocess.Popen(
        trial_command(out, "grpo", steps=20, extra=(f"buffer.redis_url={url}",)),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_step(out, 1, process)
    return process


def _restart_empty(instance: RedisInstance) -> subprocess.Popen:
    """Kill the server and start a new one, AOF off, on the same port and password."""
    instance.process.kill()
    instance.process.wait()
    args = [
        shutil.which("redis-server") or "redis-server", "--bind", "127.0.0.1",
        "--port", str(instance.port), "--requirepass", instance.password,
        "--dir", str(instance.data_dir), "--save", "", "--appendonly", "no",
    ]  # fmt: skip
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_redis_restarted_empty_mid_trial_fails_it_in_one_line(
    tmp_path: Path, redis_server: RedisInstance
) -> None:
    out = tmp_path / "trial"
    process = _run_until_step_one(out, redis_server.url)
    revived = _restart_empty(redis_server)
    try:
        started = time.monotonic()
        assert process.wait(timeout=PROMPT_S) == 1
        assert time.monotonic() - started < PROMPT_S
    finally:
        process.kill()
        revived.kill()
        revived.wait()
    reason = _failure_reason(out)
    assert LOST in reason and "rerun the trial without --resume" in reason
    assert "Traceback" not in reason


def test_redis_death_mid_trial_is_one_line_in_the_failure_reason(
    tmp_path: Path, redis_server: RedisInstance
) -> None:
    out = tmp_path / "trial"
    process = _run_until_step_one(out, redis_server.url)
    redis_server.process.kill()
    try:
        assert process.wait(timeout=PROMPT_S) == 1
    finally:
        process.kill()
    assert status(out) == "failed"
    reason = _failure_reason(out)
    gone = f"Redis at redis://:***@127.0.0.1:{redis_server.port}/0 is gone"
    assert gone in reason and "--resume" in reason
    assert "Traceback" not in reason and redis_server.password not in reason
