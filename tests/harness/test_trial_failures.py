"""Every way a trial's attempt can fail ends it `failed` with one line saying why (issue 30).

One finished 2-step trial is shared (the session's `grpo_two_steps`, tests/harness/conftest.py):
each case copies its directory, breaks the copy (its Redis AOF, the disk under it, a process) and
resumes it. Before, garbage in the AOF left trial.json
`running` behind a traceback, an AOF cut short made the generator crash-loop on a policy version
whose location was lost, a full disk left a traceback (and trial.json `running` or a multi-line
reason), a SIGKILLed supervisor's generator lived 9-15 s on, and a Redis kill ended the trial
only after its components' reconnect attempts (9-46 s on a loaded machine).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from contract import metrics as M
from contract.layout import TrialPaths
from contract.record import read_trial_record
from learner.runtime.metrics_log import GroupLedger
from tests.harness.shared_trials import GRPO_TWO_STEPS, private_copy
from tests.harness.test_fault_injection import _redis_pids
from tests.harness.trial_helpers import REPO, metrics, process_alive, wait_for_step

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

BASE = GRPO_TWO_STEPS  # every resume runs the shared trial's configuration
BASE_STEPS = BASE.steps  # 2: checkpoint at step 2 (SMALL: checkpoint_every=2)


@pytest.fixture
def finished(grpo_two_steps: Path) -> Path:
    """The shared finished trial: read-only, each test breaks a `private_copy` of it."""
    return grpo_two_steps


def _failure_reason(out: Path) -> str:
    record = read_trial_record(out)
    assert record is not None
    assert record.status.value == "failed", record.status
    reason = record.failure_reason or ""
    assert reason and "\n" not in reason and "Traceback" not in reason, reason
    return reason


def _incr_aof(out: Path) -> Path:
    [aof] = (TrialPaths(out).redis_dir / "appendonlydir").glob("*.incr.aof")
    return aof


def _commands(data: bytes) -> list[tuple[int, list[bytes]]]:
    """The AOF's commands (RESP arrays) with their byte offsets."""
    found, pos = [], 0
    while pos < len(data):
        start, end = pos, data.index(b"\r\n", pos)
        argc, pos, args = int(data[pos + 1 : end]), end + 2, []
        for _ in range(argc):
            end = data.index(b"\r\n", pos)
            length, pos = int(data[pos + 1 : end]), end + 2
            args.append(data[pos : pos + length])
            pos += length + 2
        found.append((start, args))
    return found


def test_garbage_in_the_aof_fails_the_resume_in_one_line(finished: Path, tmp_path: Path) -> None:
    out = private_copy(finished, tmp_path / "trial")
    with _incr_aof(out).open("ab") as aof:
        aof.write(b"garbage\x00\xff not a command\r\n")
    result = BASE.run(out, steps=4, resume=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    reason = _failure_reason(out)
    assert reason.startswith("redis-server exited while starting in ")
    assert "Bad file format reading the append only file" in reason
    assert "redis-check-aof --fix" in reason and "rerun the trial without --resume" in reason


def test_an_aof_cut_short_is_loaded_and_the_resume_completes(
    finished: Path, tmp_path: Path
) -> None:
    """Cut inside the MULTI that published v1: Redis loads what precedes it (its own
    aof-load-truncated), so the registry is back at v0, v1's location is gone, and batch 1's
    tickets were never issued. The learner's checkpoint of step 2 already trained batch 1; the
    generator regenerates it with v1 (its location restored from the weight store) and those
    groups are acked as trained duplicates; the trial completes."""
    out = private_copy(finished, tmp_path / "trial")
    aof = _incr_aof(out)
    data = aof.read_bytes()
    [cut] = [
        start
        for start, args in _commands(data)
        if args[:1] == [b"SET"] and args[1].endswith(b":version") and args[2] == b"1"
    ]
    aof.write_bytes(data[: cut + 10])
    result = BASE.run(out, steps=4, resume=True)
    assert result.returncode == 0, result.stdout + result.stderr
    record = read_trial_record(out)
    assert record is not None and record.status.value == "completed"
    assert record.steps_completed == 4
    ids = [row["group_id"] for row in GroupLedger(out).read()]
    assert len(ids) == len(set(ids)) == 4 * 4  # every group trained once
    assert metrics(out)[M.BUFFER_DROPPED_STALE].max() == 0
    assert "Truncating the AOF" in (TrialPaths(out).redis_dir / "redis.log").read_text()


def _mount_tmpfs(where: Path, kib: int) -> None:
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a size-limited tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={kib}k,mode=700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")


def _kib(path: Path) -> int:
    """Disk space the files under `path` take (blocks, not sizes: a tmpfs allocates pages)."""
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*")) // 1024


def test_a_full_disk_fails_in_one_line_and_resumes_once_space_is_freed(
    finished: Path, tmp_path: Path
) -> None:
    """Room for the copy and half a weight version more: the learner's next version does not
    fit (the supervisor's and Redis's few KiB do)."""
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, _kib(finished) + _kib(finished / "weights" / "v000001") // 2 + 64)
    try:
        out = private_copy(finished, disk / "trial")
        full = BASE.run(out, steps=4, resume=True)
        assert full.returncode == 1, full.stdout + full.stderr
        reason = _failure_reason(out)
        # Whichever writer meets the full disk first names it: the learner's next weight
        # version, or Redis's AOF (both live on the one tmpfs; which wins is a race).
        learner_full = f"no space left on device under {out}" in reason.lower()
        redis_full = (
            "refuses writes (MISCONF" in reason and "the trial's redis/ directory" in reason
        )
        assert learner_full or redis_full, reason
        assert "rerun the trial with --resume" in reason
        grown = ["mount", "-o", "remount,size=64m", str(disk)]
        subprocess.run(grown, check=True, capture_output=True)
        freed = BASE.run(out, steps=4, resume=True)
        assert freed.returncode == 0, freed.stdout + freed.stderr
        record = read_trial_record(out)
        assert record is not None and record.status.value == "completed"
        assert record.steps_completed == 4 and record.failure_reason is None
    finally:
        if subprocess.run(["umount", str(disk)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], check=False)


def _start_resume(out: Path) -> subprocess.Popen:
    """Resume the copy towards 20 steps; returns once step BASE_STEPS + 1 is logged, so every
    component is at work."""
    supervisor = subprocess.Popen(
        BASE.command(out, steps=20, resume=True),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_step(out, BASE_STEPS + 1, supervisor)
    except BaseException:
        supervisor.kill()
        raise
    return supervisor


def _components(out: Path) -> list[int]:
    pids = [int((out / "logs" / f"{name}.pid").read_text()) for name in ("learner", "generator-0")]
    return pids + _redis_pids(out)


def _resumed_copy(finished: Path, tmp_path: Path) -> tuple[Path, subprocess.Popen, list[int]]:
    """A private copy of `finished`, resumed till every component works: (out, supervisor, pids)."""
    out = private_copy(finished, tmp_path / "trial")
    supervisor = _start_resume(out)
    return out, supervisor, _components(out)


def _gone_after(pids: list[int], since: float, limit_s: float) -> float:
    """Seconds from `since` until none of `pids` runs; fails past `limit_s`."""
    while any(process_alive(pid) for pid in pids):
        waited = time.monotonic() - since
        assert waited < limit_s, [pid for pid in pids if process_alive(pid)]
        time.sleep(0.01)
    return time.monotonic() - since


def test_a_killed_supervisor_takes_its_components_within_a_second(
    finished: Path, tmp_path: Path
) -> None:
    _, supervisor, pids = _resumed_copy(finished, tmp_path)
    assert len(pids) == 3 and all(process_alive(pid) for pid in pids)
    supervisor.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    supervisor.wait()
    _gone_after(pids, killed, limit_s=1.0)


def test_a_killed_redis_ends_the_trial_within_seconds_in_one_line(
    finished: Path, tmp_path: Path
) -> None:
    out, supervisor, pids = _resumed_copy(finished, tmp_path)
    redis_pid = pids[-1]
    os.kill(redis_pid, signal.SIGKILL)
    killed = time.monotonic()
    try:
        code = supervisor.wait(timeout=120)
    finally:
        supervisor.kill()
    took = time.monotonic() - killed
    assert code == 1
    reason = _failure_reason(out)
    assert reason.startswith(f"the trial's Redis died: redis-server (pid {redis_pid}) was killed")
    assert "rerun the trial with --resume" in reason
    assert took < 10, f"{took:.1f} s from the kill to the supervisor's exit"
    assert not any(process_alive(pid) for pid in pids)
