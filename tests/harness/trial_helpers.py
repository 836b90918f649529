"""Run real trials (subprocesses with their own Redis) and read their results back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from contract import metrics as M
from contract.record import read_trial_record
from learner.runtime.metrics_log import MetricsLog

REPO = Path(__file__).resolve().parents[2]

# The built-in model every end-to-end test builds, unless its property needs another: a short
# warm start (the quickstart's 1500 steps build for ~45 s) on the quickstart's near-miss task,
# 16 held-out prompts. These fields (with the task's) make the model's cache key, so a session
# builds it once for all the tests that name it.
SMALL_MODEL = [
    "model.warm_start_steps=300",
    "model.warm_start_near_miss=0.6",
    "task.eval_size=16",
]
# A small, fast trial on the built-in task and SMALL_MODEL: 4 prompts x 4 samples per step,
# short answers, both eval sets of 16 prompts (the quickstart's second holds 256); these tests
# pin mechanics.
SMALL = [
    *SMALL_MODEL,
    "generation.group_size=4",
    "learner.prompts_per_step=4",
    "learner.eval_every=2",
    "evals.addition2_q.task.eval_size=16",
    "learner.checkpoint_every=2",
    "learner.lr=1e-3",
    "buffer.max_depth=64",
]
# SMALL, one trial shape for executor tests: torch generator, one of it, fixed lag 0, no MLflow.
SMALL_FIXED = [
    *SMALL,
    "generation.backend=torch",
    "generation.num_generators=1",
    "staleness.lags=[0]",
    "staleness.mode=fixed",
    "tracking.enabled=false",
]


def trial_command(
    out: Path,
    arm: str,
    *,
    steps: int,
    lag: int = 0,
    mode: str = "fixed",
    backend: str = "torch",
    resume: bool = False,
    extra: tuple[str, ...] = (),
) -> list[str]:
    args = [
        sys.executable, "-m", "harness.cli", "trial", str(REPO / "configs/quickstart.yaml"),
        "--arm", arm, "--seed", "0", "--lag", str(lag), "--mode", mode,
        "--out", str(out), "--steps", str(steps),
    ]  # fmt: skip
    if resume:
        args.append("--resume")
    return [*args, *SMALL, f"generation.backend={backend}", *extra]


def run_argv(
    argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run an argv from the repository root to its end (`timeout` s at most), output as text."""
    return subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def harness(*args: str) -> subprocess.CompletedProcess:
    """The `harness` command line as a user runs it, for commands that answer within 2 minutes."""
    return run_argv([sys.executable, "-m", "harness.cli", *args], timeout=120)


def run_trial(out: Path, arm: str, **kwargs) -> subprocess.CompletedProcess:
    return run_argv(trial_command(out, arm, **kwargs))


def metrics(out: Path) -> pd.DataFrame:
    return MetricsLog(out).read().to_pandas().set_index(M.STEP)


def deterministic_columns(frame: pd.DataFrame) -> pd.DataFrame:
    keep = [c for c in frame.columns if c != M.TIMESTAMP and not M.is_timing_dependent(c)]
    return frame[keep]


def status(out: Path) -> str:
    """The status in the trial's record, validated like every reader of trial.json does."""
    record = read_trial_record(out)
    return "" if record is None else record.status.value


def wait_for_step(out: Path, step: int, process: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    log = MetricsLog(out)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"trial exited early with {process.returncode}")
        if log.root.exists() and step in log.steps():
            return
        time.sleep(0.1)
    raise AssertionError(f"step {step} not reached in {timeout_s} s")


def kill_component(out: Path, name: str) -> int:
    pid = int((out / "logs" / f"{name}.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    return pid


def assert_same_metrics(first: Path, second: Path, steps: int | None = None) -> None:
    """The two trials logged bitwise-identical metrics, timing-dependent columns aside. With
    `steps`, `second` ran that many steps and `first` as many or more (a shared longer trial):
    `second`'s rows are `first`'s rows 0..steps."""
    reference = deterministic_columns(metrics(first))
    if steps is not None:
        reference = reference.loc[:steps]
    pd.testing.assert_frame_equal(
        reference, deterministic_columns(metrics(second)), check_exact=True
    )


def process_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
