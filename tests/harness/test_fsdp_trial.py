"""An FSDP trial (`learner.parallel=fsdp`) killed mid-run resumes at another number of ranks.

`harness trial` starts the learner under torchrun (`executor.learner_ranks`); its checkpoints
are sharded (torch.distributed.checkpoint) and reshard on load. One trial of PPO (policy,
critic and both optimisers sharded) is SIGKILLed (the supervisor, taking its components and
ranks with it) after step 3 with 2 ranks, resumed with 1 rank and killed after step 5, then
resumed with 2 ranks to the end: every group is trained exactly once, each resume starts from
the newest checkpoint, and the published weights are full safetensors the generator loads.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from contract import metrics as M
from contract.record import read_trial_record
from learner.runtime.metrics_log import GroupLedger
from tests.harness.trial_helpers import (
    REPO,
    metrics,
    process_alive,
    trial_command,
    wait_for_step,
)

pytestmark = pytest.mark.e2e

STEPS = 6  # checkpoints at 2, 4, 6 (SMALL: learner.checkpoint_every=2)
FSDP = ("learner.parallel=fsdp", "tracking.enabled=false")


def _ranks(n: int) -> tuple[str, ...]:
    return (*FSDP, f"executor.learner_ranks={n}")


def _run_until(out: Path, ranks: int, step: int, *, resume: bool) -> None:
    """Run (or resume) the trial with `ranks` learner ranks; SIGKILL the supervisor once `step`
    is logged, and wait until every learner rank is gone."""
    command = trial_command(out, "ppo", steps=STEPS, resume=resume, extra=_ranks(ranks))
    supervisor = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_step(out, step, supervisor, timeout_s=400)
        ranks_pids = _learner_ranks(out)
    finally:
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait()
    deadline = time.monotonic() + 30
    while any(process_alive(pid) for pid in ranks_pids):
        assert time.monotonic() < deadline, "a learner rank outlived the killed supervisor"
        time.sleep(0.05)


def _learner_ranks(out: Path) -> list[int]:
    """The learner process (torchrun's agent, or the learner) and its children (the ranks)."""
    agent = int((out / "logs" / "learner.pid").read_text())
    children = Path(f"/proc/{agent}/task/{agent}/children")
    found = [int(pid) for pid in children.read_text().split()] if children.exists() else []
    return [agent, *found]


@pytest.mark.slow
def test_an_fsdp_trial_resumes_at_another_number_of_ranks(tmp_path: Path) -> None:
    out = tmp_path / "trial"
    _run_until(out, ranks=2, step=3, resume=False)  # checkpoint of step 2 by 2 ranks
    shards = sorted((out / "checkpoints" / "step-000002" / "shards").glob("*.distcp"))
    assert len(shards) == 2, shards  # one file per rank
    _run_until(out, ranks=1, step=5, resume=True)  # from 2 with 1 rank; checkpoint of step 4
    shards = sorted((out / "checkpoints" / "step-000004" / "shards").glob("*.distcp"))
    assert len(shards) == 1, shards
    finished = subprocess.run(
        trial_command(out, "ppo", steps=STEPS, resume=True, extra=_ranks(2)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-2000:]
    record = read_trial_record(out)
    assert record is not None and record.status.value == "completed"
    assert record.steps_completed == STEPS
    learner_log = (out / "logs" / "learner.log").read_text()
    assert "resuming from checkpoint step-000002" in learner_log
    assert "resuming from checkpoint step-000004" in learner_log
    ids = [row["group_id"] for row in GroupLedger(out).read()]
    assert len(ids) == len(set(ids)) == STEPS * 4  # every group trained once
    frame = metrics(out)
    assert list(frame.index) == list(range(STEPS + 1))
    assert frame[M.POLICY_LOSS].iloc[1:].notna().all()
    assert frame[M.VALUE_LOSS].iloc[1:].notna().all()
