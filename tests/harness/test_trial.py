"""Whole trials as a user runs them: real processes, real Redis, real models (design 3, 5, 9).

The uninterrupted reference of the fixed-lag-1 GRPO trial is the session's shared `grpo_lag1`
(14 steps; tests/harness/conftest.py): trials here run its first STEPS steps.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from buffer.server import EmbeddedRedis
from buffer.streams import TicketDispenser, connect, stop_requested
from contract import metrics as M
from contract.layout import TrialPaths
from contract.record import read_trial_record
from harness.experiment.grid import classify_trial
from harness.experiment.trial_runs import read_evals, read_rollouts
from harness.launch.trials import PlannedTrial
from harness.trial.learner_main import FAULT_EXIT_AFTER_STEP_ENV
from learner.runtime.checkpoint import CheckpointStore
from learner.runtime.metrics_log import GroupLedger
from tests.harness.shared_trials import GRPO_LAG1, Recipe
from tests.harness.trial_helpers import (
    REPO,
    assert_same_metrics,
    deterministic_columns,
    kill_component,
    metrics,
    process_alive,
    run_argv,
    run_trial,
    status,
    trial_command,
    wait_for_step,
)

pytestmark = pytest.mark.e2e

STEPS = 4
# The shared reference is this module's GRPO trial at lag 1, run for at least STEPS steps.
assert Recipe("grpo", GRPO_LAG1.steps, lag=1) == GRPO_LAG1 and GRPO_LAG1.steps >= STEPS


@pytest.mark.parametrize("arm", ["gspo", "grpo", "ppo", "gspo_token"])
def test_short_trial_per_arm_with_vllm(vllm_arms: Path, arm: str) -> None:
    """Each objective's 2-step lag-0 trial on the vLLM generator (the shared experiment's)."""
    trial = vllm_arms / "trials" / f"{arm}__seed0__lag0__fixed"
    assert status(trial) == "completed"
    frame = metrics(trial)
    assert list(frame.index) == [0, 1, 2]
    trained = frame.loc[[1, 2]]
    assert np.isfinite(trained[M.POLICY_LOSS]).all()
    assert (trained[M.STALENESS_MAX] == 0).all()
    # vLLM's float32 behaviour logprobs match the learner's recompute of the same weights.
    assert (trained[M.MISMATCH_KL_BEHAVIOR] < 1e-6).all()
    assert np.isfinite(frame[M.EVAL_PASS_RATE].loc[[0, 2]]).all()
    # Scored on the vLLM engine (eval.engine: generator): both sets, at steps 0 and 2.
    evals = read_evals(trial).to_pandas()
    assert sorted(zip(evals["step"], evals["eval_set"], strict=True)) == [
        (0, "addition2"), (0, "addition2_q"), (2, "addition2"), (2, "addition2_q")
    ]  # fmt: skip
    primary = evals[evals["eval_set"] == "addition2"].set_index("step")["greedy_pass_rate"]
    assert primary.to_dict() == frame[M.EVAL_PASS_RATE].loc[[0, 2]].to_dict()
    if arm == "ppo":
        assert np.isfinite(trained[M.VALUE_LOSS]).all()


@pytest.fixture
def reference_run(grpo_lag1: Path) -> Path:
    """An uninterrupted fixed-lag trial with the torch generator (the bitwise reference, through
    its first STEPS steps); shared, read-only."""
    return grpo_lag1


def test_the_rollout_log_reads_back_the_trained_samples(reference_run: Path) -> None:
    """The shared trial's rollout log (the default option: every step, every group), read by
    the harness's reader: the groups of each step's ledger with every sample, the ledger's lag,
    the group's version on every token, and text decoded by the trial's tokenizer: each prompt
    as the trial's prompts.parquet renders it."""
    log = read_rollouts(reference_run).to_pandas()
    ledger = {(r["step"], r["group_id"]): r for r in GroupLedger(reference_run).read()}
    assert sorted(set(zip(log["step"], log["group_id"], strict=True))) == sorted(ledger)
    sizes = log.groupby(["step", "group_id"])["sample_index"].agg(["count", "max"])
    assert sizes["count"].nunique() == 1 and (sizes["max"] == sizes["count"] - 1).all()
    for row in log.itertuples(index=False):
        assert row.lag == ledger[(row.step, row.group_id)]["lag"] == min(row.step - 1, 1)
        assert list(row.token_versions) == [row.policy_version] * len(row.response_ids)
        assert isinstance(row.response_text, str)
    prompts = pd.read_parquet(TrialPaths(reference_run).prompts)
    train = prompts[prompts["split"] == "train"]["prompt"].to_numpy()
    assert (log["prompt_text"].to_numpy() == train[log["prompt_index"].to_numpy()]).all()


def test_fixed_mode_is_bitwise_reproducible(reference_run: Path, tmp_path: Path) -> None:
    result = run_trial(tmp_path, "grpo", steps=STEPS, lag=1)
    assert result.returncode == 0, result.stdout + result.stderr
    first, second = (
        deterministic_columns(metrics(reference_run)).loc[:STEPS],
        deterministic_columns(metrics(tmp_path)),
    )
    pd.testing.assert_frame_equal(first, second, check_exact=True)
    assert (first[M.STALENESS_MAX].loc[2:] == 1).all()  # batch k used version k - 1


def test_fixed_mode_is_bitwise_reproducible_with_vllm(
    vllm_grpo_lag1: Path, vllm_arms: Path
) -> None:
    """One vLLM-CPU generator per trial: the same claim order, so the same engine batches. At
    lag 1 the generator runs a batch ahead; a cold `harness trial` and the shared experiment's
    trial of the same configuration (a warm generator, its engine kept from earlier trials) log
    the same metrics bit for bit."""
    warm = vllm_arms / "trials" / "grpo__seed0__lag1__fixed"
    assert status(vllm_grpo_lag1) == status(warm) == "completed"
    assert_same_metrics(vllm_grpo_lag1, warm)
    assert (metrics(warm)[M.STALENESS_MAX].loc[2:] == 1).all()  # a version behind from step 2


def test_learner_killed_then_resumed_matches_uninterrupted(
    reference_run: Path, tmp_path: Path
) -> None:
    process = subprocess.Popen(
        trial_command(tmp_path, "grpo", steps=STEPS, lag=1),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_step(tmp_path, 3, process)  # past the step-2 checkpoint: step 3 must be redone
    kill_component(tmp_path, "learner")
    assert process.wait(timeout=120) != 0
    assert status(tmp_path) == "failed"
    resumed = run_trial(tmp_path, "grpo", steps=STEPS, lag=1, resume=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_same_metrics(reference_run, tmp_path, steps=STEPS)


def test_generator_killed_trial_finishes_training_each_group_once(tmp_path: Path) -> None:
    process = subprocess.Popen(
        trial_command(tmp_path, "gspo", steps=STEPS),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_step(tmp_path, 1, process)
    kill_component(tmp_path, "generator-0")
    assert process.wait(timeout=600) == 0
    assert status(tmp_path) == "completed"
    store = CheckpointStore(tmp_path / "checkpoints")
    import torch

    step = store.latest_step()
    payload = torch.load(
        tmp_path / "checkpoints" / f"step-{step:06d}" / "state.pt", weights_only=True
    )
    trained = payload["training_state"]["trained_group_ids"]
    assert len(trained) == len(set(trained)) == STEPS * 4  # prompts_per_step=4
    assert list(metrics(tmp_path).index) == list(range(STEPS + 1))


def test_bounded_mode_never_exceeds_max_lag(tmp_path: Path) -> None:
    result = run_trial(tmp_path, "gspo", steps=6, lag=1, mode="bounded")
    assert result.returncode == 0, result.stdout + result.stderr
    frame = metrics(tmp_path).loc[1:]
    assert (frame[M.STALENESS_MAX] <= 1).all()
    assert np.isfinite(frame[M.PERF_LEARNER_WAIT_FRAC]).all()
    # Staleness accounting: every trained group's generation and queue times are positive and
    # add up to its age (generation start -> taken), per group in the ledger and per step.
    ledger = GroupLedger(tmp_path).read()
    assert len(ledger) == 6 * 4
    for row in ledger:
        assert row["generation_s"] > 0 and row["queue_s"] > 0, row
        assert row["generation_s"] + row["queue_s"] == pytest.approx(row["age_s"], abs=1e-6)
        assert row["lag"] == row["step"] - 1 - row["policy_version"] <= 1
    total = frame[M.STALENESS_GENERATION_S] + frame[M.STALENESS_QUEUE_S]
    assert np.allclose(total, frame[M.STALENESS_AGE_S], atol=1e-6)
    assert (frame[M.STALENESS_DROPPED] >= 0).all()


def _run_with_learner_exit_after(out: Path, step: int, extra: tuple[str, ...] = ()) -> None:
    """A trial whose learner dies abruptly right after logging `step` (the learner's
    fault-injection hook, harness.trial.learner_main): it fails, resumably."""
    env = {**os.environ, FAULT_EXIT_AFTER_STEP_ENV: str(step)}
    result = run_argv(trial_command(out, "grpo", steps=STEPS, lag=1, extra=extra), env=env)
    assert result.returncode != 0, result.stdout + result.stderr
    assert status(out) == "failed"
    assert f"fault injection: exiting after step {step}" in (out / "logs/learner.log").read_text()


def _assert_resumes_to_reference(out: Path, reference: Path, extra: tuple[str, ...] = ()) -> None:
    resumed = run_trial(out, "grpo", steps=STEPS, lag=1, resume=True, extra=extra)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert status(out) == "completed"
    assert_same_metrics(reference, out, steps=STEPS)


def test_resume_after_a_kill_before_all_groups_were_pushed(
    reference_run: Path, tmp_path: Path
) -> None:
    """The teardown's stop flag must not outlive it: at lag 1 a learner dead after publishing v1
    left tickets 12..15 (batch 3, version 2) unadmitted, so the resumed generators must go on.
    (The stop flag used to survive, every generator exited at once, the learner starved.)"""
    every_step = ("learner.checkpoint_every=1",)  # resume from the step-1 checkpoint
    _run_with_learner_exit_after(tmp_path, 1, every_step)
    assert CheckpointStore(tmp_path / "checkpoints").latest_step() == 1
    stopped, issued = _saved_run_state(tmp_path)
    assert stopped and issued <= 12 < STEPS * 4  # the teardown's stop; batch 3 never started
    _assert_resumes_to_reference(tmp_path, reference_run, every_step)


def test_resume_of_a_learner_killed_after_publishing_before_any_checkpoint(
    reference_run: Path, tmp_path: Path
) -> None:
    """Killed after publishing v1, before the step-2 checkpoint: the resume restarts from the
    initial weights, accepts the versions already published (bitwise the ones it redoes) and
    retrains the uncommitted groups. (It used to fail publishing v0 below the current v1.)"""
    _run_with_learner_exit_after(tmp_path, 1)
    assert CheckpointStore(tmp_path / "checkpoints").latest_step() is None
    _assert_resumes_to_reference(tmp_path, reference_run)


def test_supervisor_sigkill_leaves_a_resumable_running_trial(
    reference_run: Path, tmp_path: Path
) -> None:
    """A SIGKILLed supervisor cannot write its record: trial.json stays `running`, which
    `harness run` resumes, no component outlives it, and `--resume` overwrites the status."""
    process = subprocess.Popen(
        trial_command(tmp_path, "grpo", steps=STEPS, lag=1),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_step(tmp_path, 2, process)
    pids = [int(p.read_text()) for p in (tmp_path / "logs").glob("*.pid")]
    process.kill()
    process.wait(timeout=30)
    assert status(tmp_path) == "running"
    planned = PlannedTrial("grpo", "grpo", 0, 1, "fixed", tmp_path.name, tmp_path)
    assert classify_trial(planned).state == "resume"
    deadline = time.monotonic() + 30
    while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(process_alive(pid) for pid in pids)  # PR_SET_PDEATHSIG: no orphaned component
    _assert_resumes_to_reference(tmp_path, reference_run)
    assert read_trial_record(tmp_path).resumed


def _saved_run_state(out: Path) -> tuple[bool, int]:
    """(stop flag set, tickets issued) in the run state a finished trial left in its Redis AOF."""
    with EmbeddedRedis(TrialPaths(out).redis_dir) as server, connect(server.url) as client:
        [stop_key] = client.keys("gspo:*:stop")
        run_id = stop_key.decode().removeprefix("gspo:").removesuffix(":stop")
        tickets = TicketDispenser(client, run_id)
        return stop_requested(client, run_id), tickets.issued()
