"""One supervisor per trial directory: a second one waits for the lock, then fails untouched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contract.layout import TrialPaths
from contract.trial import TrialSpec
from harness.config import load_config
from harness.file_lock import LockTimeoutError, file_lock
from harness.trial import supervisor
from harness.trial.supervisor import TrialFailedError, run_trial
from tests.harness.trial_helpers import REPO

HOLD = "import sys, time; from pathlib import Path; from harness.file_lock import file_lock\n"
HOLD += "with file_lock(Path(sys.argv[1]), 5, 'x'):\n    print('held', flush=True); time.sleep(60)"


def _hold_from_another_process(path: Path) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_held_lock_times_out_naming_its_holder(tmp_path: Path) -> None:
    holder = _hold_from_another_process(tmp_path / "x.lock")
    try:
        with (
            pytest.raises(LockTimeoutError, match=r"x\.lock, held by the other test process"),
            file_lock(tmp_path / "x.lock", 0.2, "the other test process"),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    with file_lock(tmp_path / "x.lock", 0.2, "nobody"):  # the kernel dropped the dead one's lock
        pass


def test_a_second_supervisor_fails_before_touching_the_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor, "SUPERVISOR_LOCK_WAIT_S", 0.3)
    cfg = load_config(REPO / "configs/quickstart.yaml")
    spec = TrialSpec(arm="gspo", seed=0, lag=0, mode="fixed")
    paths = TrialPaths(tmp_path / spec.name)
    (paths.checkpoints / "step-000002").mkdir(parents=True)  # the running supervisor's state
    holder = _hold_from_another_process(paths.supervisor_lock)
    try:
        with pytest.raises(
            TrialFailedError, match=rf"held by another supervisor of trial {spec.name}"
        ):
            run_trial(cfg, spec, paths.root, steps=1, resume=False)
    finally:
        holder.kill()
        holder.wait()
    assert (paths.checkpoints / "step-000002").is_dir()  # a fresh start would have removed it
    assert not paths.metadata.exists()
