"""A crashed generator is restarted at once and takes its tickets back (real trial, real Redis)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from buffer.tickets import DEFAULT_LEASE_S
from harness.experiment.trial_runs import read_evals
from harness.trial.generator_evals import FAULT_CRASH_EVAL_FILE_ENV
from harness.trial.generator_main import FAULT_CRASH_FILE_ENV
from harness.trial.restarts import RestartBudget
from learner.runtime.checkpoint import CheckpointStore
from tests.buffer.file_modes import assert_private
from tests.harness.trial_helpers import REPO, metrics, status, trial_command

STEPS = 4
PROMPTS_PER_STEP = 4  # trial_helpers.SMALL
# A restart (imports, model load) takes seconds, a lease wait 120 s: a crash-to-crash interval
# above this means a restarted generator waited out its own lease.
RESTART_DEADLINE_S = 0.8 * DEFAULT_LEASE_S


def test_restart_budget_renews_with_progress() -> None:
    budget = RestartBudget(limit=3)
    # Three crashes at progress 5 (nothing happened in between): three restarts granted...
    assert [budget.spend(5) for _ in range(3)] == [True, True, True]
    assert budget.spend(5) is False  # ...the fourth in a row without progress fails
    assert budget.spend(4) is False  # a lower reading is no progress
    assert budget.spend(6) is True  # progress since the last restart: a fresh budget
    assert (budget.used, budget.mark) == (1, 6)
    assert [budget.spend(6) for _ in range(3)] == [True, True, False]


def _crash_at(path: Path, ticket: int) -> None:
    """Arm the generator's fault hook: the claim holding `ticket` exits (atomic write)."""
    staging = path.with_suffix(".tmp")
    staging.write_text(str(ticket))
    staging.rename(path)


def _wait_consumed(path: Path, process: subprocess.Popen, timeout_s: float) -> None:
    """Wait until a generator crashed on the armed ticket."""
    deadline = time.monotonic() + timeout_s
    while path.exists():
        assert process.poll() is None, f"trial exited early with {process.returncode}"
        assert time.monotonic() < deadline, f"no generator claimed the ticket in {timeout_s} s"
        time.sleep(0.05)


@pytest.mark.e2e
def test_four_crashes_with_progress_between_finish_the_trial_without_lease_waits(
    tmp_path: Path,
) -> None:
    """The generator crashes holding a whole batch, four times (batches 0..3, one more than the
    old whole-trial budget of 3). Each restart must reclaim its batch at once: the old code
    waited out the 120 s lease, and failed the trial on the fourth crash. A fifth crash holds the
    last version's eval request: its restart answers it at once too."""
    out, crash_file, eval_crash = tmp_path / "trial", tmp_path / "crash", tmp_path / "eval"
    env = {
        **os.environ,
        FAULT_CRASH_FILE_ENV: str(crash_file),
        FAULT_CRASH_EVAL_FILE_ENV: str(eval_crash),
    }
    _crash_at(crash_file, 0)
    _crash_at(eval_crash, STEPS)  # and a fifth, mid-eval: holding the last version's evals
    process = subprocess.Popen(
        trial_command(out, "gspo", steps=STEPS),
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_consumed(crash_file, process, timeout_s=300)  # trial start-up, then batch 0
        for batch in range(1, STEPS):
            # The last crash held batch - 1; its restart must push that batch (progress, which
            # renews the restart budget) and claim this one well within one lease.
            _crash_at(crash_file, batch * PROMPTS_PER_STEP)
            _wait_consumed(crash_file, process, timeout_s=RESTART_DEADLINE_S)
        assert process.wait(timeout=300) == 0
        assert not eval_crash.exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert status(out) == "completed"
    log = (out / "logs" / "generator-0.log").read_text()
    for batch in range(STEPS):
        held = list(range(batch * PROMPTS_PER_STEP, (batch + 1) * PROMPTS_PER_STEP))
        assert f"fault injection: exiting holding tickets {held}" in log
    # The restart answered the last evals at once (the supervisor freed the dead one's request;
    # the learner would otherwise wait out its 120 s lease), and they were recorded once.
    assert f"fault injection: exiting holding the eval request of version {STEPS}" in log
    evals = read_evals(out).to_pandas()
    rows = list(zip(evals["step"], evals["eval_set"], strict=True))
    assert len(rows) == len(set(rows)) and sorted({step for step, _ in rows}) == [0, 2, STEPS]
    step = CheckpointStore(out / "checkpoints").latest_step()
    state = torch.load(out / "checkpoints" / f"step-{step:06d}" / "state.pt", weights_only=True)
    trained = state["training_state"]["trained_group_ids"]
    assert len(trained) == len(set(trained)) == STEPS * PROMPTS_PER_STEP
    assert list(metrics(out).index) == list(range(STEPS + 1))
    assert_private(out / "logs")  # component logs and the Redis AOF are 0600 in 0700 dirs
    assert_private(out / "redis")
