"""Warm component processes (executor.warm_components): a slot's learner and generator processes
serve trial after trial, and nothing a trial records may tell.

The first tests drive the real pieces (a warm process spawned by `WarmSlots`, a `WarmChild`
handing it a command over its socket, the pool leasing and releasing slots) with cheap commands:
`harness config show`, fake trials. The end-to-end ones run `harness run` with one slot and
compare its trials bitwise with cold ones, with the vLLM engine kept between trials, and with a
warm generator killed mid-trial.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.config import load_config, load_config_data
from harness.executors.local import warm_plan
from harness.experiment.grid import expand_trials
from harness.experiment.run import ExperimentRequest, run_experiment
from harness.launch.pool import SubprocessTrialPool
from harness.launch.processes import python_module_args
from harness.launch.trials import PoolLimits, trial_command
from harness.launch.warm_child import WarmChild
from harness.launch.warm_protocol import warm_components_from_env
from harness.launch.warm_slots import WarmPlan, WarmSlots
from harness.trial.generator_main import FAULT_CRASH_FILE_ENV
from tests.harness.shared_trials import GRPO_TWO_STEPS, NO_EVALS, Recipe
from tests.harness.test_experiment import FAKE_PREFIX, alive, write_config
from tests.harness.trial_helpers import REPO, SMALL_FIXED, assert_same_metrics, status

ENGINE_START_LINE = "Initializing a V1 LLM engine"  # vLLM logs it once per engine start


@pytest.fixture
def one_slot(tmp_path: Path) -> Iterator[WarmSlots]:
    """One slot keeping a `learner` process that preloads nothing (a cheap stand-in process:
    the real one, only without torch)."""
    warm = WarmSlots(WarmPlan({"learner": ()}), slots=1, log_dir=tmp_path / "warm")
    yield warm
    warm.close()


def warm_child(slot_env: dict[str, str], args: list[str], log: Path) -> WarmChild:
    """The `learner` component of a trial whose environment is `slot_env`, as its supervisor's
    launcher makes it (harness.executors.local.LocalLauncher)."""
    path, pid = warm_components_from_env(slot_env)["learner"]
    return WarmChild("learner", args, log, {}, socket_path=path, warm_pid=pid)


def finish(child: WarmChild, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while (code := child.poll()) is None:
        assert time.monotonic() < deadline, f"{child.name} still running after {timeout_s} s"
        time.sleep(0.05)
    return code


def wait_until_dead(pid: int, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still alive after {timeout_s} s"
        time.sleep(0.05)


def config_show(*extra: str) -> list[str]:
    return python_module_args("harness.cli", "config", "show", *extra)


QUICKSTART = REPO / "configs/quickstart.yaml"


def test_the_plan_keeps_what_a_trial_starts_and_nothing_torchrun_or_ray_starts() -> None:
    plan = warm_plan(load_config(QUICKSTART, ["generation.num_generators=2"]))
    assert plan is not None and plan.components == {
        "learner": ("learner",),
        "generator-0": ("generator", "vllm"),
        "generator-1": ("generator", "vllm"),
    }
    torch_two_ranks = ["generation.backend=torch", "executor.learner_ranks=2"]
    plan = warm_plan(load_config(QUICKSTART, torch_two_ranks))
    assert plan is not None and plan.components == {"generator-0": ("generator", "torch")}
    assert plan.zygote  # it forks the warm processes (and their restarts)
    cold = warm_plan(load_config(QUICKSTART, ["executor.warm_components=false"]))
    assert cold is not None and cold.components == {} and cold.zygote
    plain = ["executor.warm_components=false", "executor.fork_components=false"]
    assert warm_plan(load_config(QUICKSTART, plain)) == WarmPlan({})
    spawned = warm_plan(load_config(QUICKSTART, ["executor.fork_components=false"]))
    assert spawned is not None and len(spawned.components) == 2 and not spawned.zygote
    assert warm_plan(load_config(QUICKSTART, ["executor.kind=ray"])) is None


def test_a_warm_process_runs_commands_as_a_cold_one_and_a_failure_ends_it(
    one_slot: WarmSlots, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # the relative config path resolves in the supervisor's directory
    index, env = one_slot.lease(dict(os.environ))
    warm_pid = one_slot.pids(index)["learner"]
    log = tmp_path / "trial" / "logs" / "learner.log"

    child = warm_child(env, config_show("configs/quickstart.yaml", "learner.steps=7"), log)
    child.start()
    assert child.pid == warm_pid
    assert log.with_suffix(".pid").read_text() == str(warm_pid)  # operators find it as ever
    assert finish(child) == 0
    shown = log.read_text()
    assert "name: quickstart" in shown and "steps: 7" in shown  # its output, in its log
    assert oct(log.stat().st_mode & 0o777) == oct(0o600)
    one_slot.release(index, keep=True)
    assert one_slot.pids(index) == {"learner": warm_pid} and alive(warm_pid)

    # The next trial's command fails: the exit code comes back, and the process ends with it.
    index, env = one_slot.lease(dict(os.environ))
    child = warm_child(env, config_show("configs/no_such.yaml"), log)
    child.start()
    assert finish(child) == 2
    assert "error:" in child.last_line() and "no_such.yaml" in child.tail()
    wait_until_dead(warm_pid)
    # A restart of the component is a cold process, as after any crash.
    child.start()
    assert child.pid != warm_pid and child.process is not None
    assert finish(child) == 2
    one_slot.release(index, keep=True)  # kept, but dead: replaced
    (fresh,) = one_slot.pids(index).values()
    assert fresh != warm_pid and alive(fresh) and one_slot.spawned == 2


def test_a_slot_hands_on_its_processes_only_after_a_trial_that_ended_well(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAIL_ARMS", "grpo")
    for name in ("FAKE_DIVERGE_ARMS", "FAKE_HANG", "FAKE_LEAK", "FAKE_ESCAPE"):
        monkeypatch.delenv(name, raising=False)
    cfg, path = write_config(tmp_path, seeds=[0])  # gspo completes, grpo fails
    gspo, grpo = expand_trials(cfg)
    warm = WarmSlots(WarmPlan({"learner": (), "generator-0": ()}), 1, tmp_path / "warm")
    command = trial_command(path, prefix=FAKE_PREFIX)
    with SubprocessTrialPool(command, PoolLimits(max_parallel=1), warm=warm) as pool:
        pool.start(gspo, resume=False)
        given = warm.pids(0)
        (done,) = pool.wait_any(60)
        assert done.status == "completed"
        assert warm.pids(0) == given  # handed on

        pool.start(grpo, resume=False)
        (done,) = pool.wait_any(60)
        assert done.status == "failed"
        after = warm.pids(0)
        assert set(after) == set(given) and not set(after.values()) & set(given.values())
        for pid in given.values():
            wait_until_dead(pid)
    for pid in after.values():  # closing the pool ends them
        wait_until_dead(pid)


@pytest.mark.e2e
def test_a_warm_generator_stops_on_sigterm_and_dies_with_its_supervisor(
    tmp_path: Path, redis_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (the supervisor's teardown) ends the trial's generator loop and keeps the
    process; a supervisor killed mid-trial takes the warm process down with it, as
    PR_SET_PDEATHSIG takes a cold one."""
    monkeypatch.chdir(REPO)
    warm = WarmSlots(WarmPlan({"generator-0": ("generator", "torch")}), 1, tmp_path / "warm")
    try:
        _, env = warm.lease(dict(os.environ))
        (warm_pid,) = warm.pids(0).values()
        config = tmp_path / "exp.yaml"
        data = load_config_data(REPO / "configs/quickstart.yaml", list(SMALL_FIXED))
        config.write_text(json.dumps(data))
        args = python_module_args(
            "harness.cli", "generator", str(config), "--arm", "grpo", "--seed", "0",
            "--lag", "0", "--out", str(tmp_path / "trial"), "--steps", "2", "--id", "gen-0",
        )  # fmt: skip
        component_env = {"HARNESS_REDIS_URL": redis_server.url, "HARNESS_RUN_ID": "warm-test"}
        log = tmp_path / "trial" / "logs" / "generator-0.log"
        path, pid = warm_components_from_env(env)["generator-0"]
        child = WarmChild("generator-0", args, log, component_env, socket_path=path, warm_pid=pid)
        child.start()
        registered = redis_server.client()
        deadline = time.monotonic() + 120
        while not registered.keys("*warm-test*"):  # registered: waits for version 0 now
            assert child.poll() is None, child.tail()
            assert time.monotonic() < deadline, child.tail()
            time.sleep(0.2)
        child.stop(timeout_s=30)
        assert child.poll() == 0 and alive(warm_pid), child.tail()

        # A supervisor (a real process, SIGKILLed) that handed the same process a trial.
        script = (
            "import ast, sys, time\n"
            "from pathlib import Path\n"
            "from harness.launch.warm_child import WarmChild\n"
            "args, log, env, path, pid = ast.literal_eval(sys.argv[1])\n"
            "child = WarmChild('generator-0', args, Path(log), env,\n"
            "                  socket_path=path, warm_pid=pid)\n"
            "child.start()\n"
            "print('started', flush=True)\n"
            "time.sleep(600)\n"
        )
        handed = repr((args, str(log), component_env, path, pid))
        supervisor = subprocess.Popen(
            [sys.executable, "-c", script, handed], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        assert supervisor.stdout is not None and supervisor.stdout.readline() == "started\n"
        time.sleep(1.0)  # mid-trial
        assert alive(warm_pid)
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait()
        wait_until_dead(warm_pid)
    finally:
        warm.close()


def quickstart_experiment(root: Path, *overrides: str) -> Path:
    """`harness run` of the quickstart with `overrides`, one trial at a time; its output."""
    root.mkdir(parents=True)
    config = root / "exp.yaml"
    data = load_config_data(REPO / "configs/quickstart.yaml", list(overrides))
    config.write_text(json.dumps(data))
    request = ExperimentRequest(load_config(config), config, root / "out", (), 1)
    done = run_experiment(request, report=False)
    assert done.exit_code == 0, [(t.spec.trial_name, t.status, t.message) for t in done.trials]
    return root / "out" / "trials"


def pid_of(trial: Path, component: str) -> int:
    return int((trial / "logs" / f"{component}.pid").read_text())


def warm_trial_number(trial: Path, component: str) -> int | None:
    """Which trial of its warm process the component's (last) start was, per its log; None
    for a cold start."""
    found = re.findall(r"^warm component process \d+: trial (\d+) of this process$",
                       (trial / "logs" / f"{component}.log").read_text(), re.MULTILINE)  # fmt: skip
    return int(found[-1]) if found else None


@pytest.mark.e2e
def test_a_kept_vllm_engine_gives_the_next_trial_bitwise_what_a_fresh_one_gives(
    vllm_arms: Path, vllm_grpo_lag1: Path
) -> None:
    """Five trials on one slot (the shared vLLM experiment: four objectives at lag 0, GRPO at
    lag 1 too), in the order they ran: the first starts the slot's learner, generator and vLLM
    engine; every later one gets the same processes and the same engine, put back on the
    initial weights after the trials before it trained. One of them equals a cold `harness
    trial` of it bit for bit."""
    trials = sorted(path for path in (vllm_arms / "trials").iterdir() if path.is_dir())
    assert [trial.name for trial in trials] == [
        "grpo__seed0__lag0__fixed",
        "grpo__seed0__lag1__fixed",
        "gspo__seed0__lag0__fixed",
        "gspo_token__seed0__lag0__fixed",
        "ppo__seed0__lag0__fixed",
    ]
    assert {status(trial) for trial in trials} == {"completed"}
    by_start = sorted(trials, key=lambda t: warm_trial_number(t, "generator-0") or 0)
    for number, trial in enumerate(by_start, start=1):
        for component in ("learner", "generator-0"):
            assert pid_of(trial, component) == pid_of(by_start[0], component)
            assert warm_trial_number(trial, component) == number
        engine_started = ENGINE_START_LINE in (trial / "logs" / "generator-0.log").read_text()
        assert engine_started == (number == 1)
    kept = vllm_arms / "trials" / "grpo__seed0__lag1__fixed"
    assert warm_trial_number(kept, "generator-0") > 1  # an engine earlier trials trained
    assert_same_metrics(vllm_grpo_lag1, kept)


@pytest.mark.e2e
def test_warm_trials_equal_cold_ones_and_a_killed_warm_generator_is_replaced(
    tmp_path: Path, grpo_two_steps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first trial's warm generator dies holding tickets (as by SIGKILL): the supervisor
    restarts it cold and the trial completes; the slot replaces the process, keeps the learner,
    and the second trial equals the shared cold trial of the same config bit for bit."""
    assert Recipe("grpo", steps=2, extra=NO_EVALS) == GRPO_TWO_STEPS  # the same config
    crash = tmp_path / "crash_at_ticket"
    crash.write_text("1")
    monkeypatch.setenv(FAULT_CRASH_FILE_ENV, str(crash))
    trials = quickstart_experiment(
        tmp_path / "warm", *SMALL_FIXED, *NO_EVALS, "learner.steps=2",
        "arms=[{name: grpo, objective: grpo}]", "seeds=[1, 0]",
    )  # fmt: skip
    first, second = trials / "grpo__seed1__lag0__fixed", trials / "grpo__seed0__lag0__fixed"
    assert not crash.exists()  # the fault fired, in the first trial
    assert "fault injection" in (first / "logs" / "generator-0.log").read_text()
    assert status(first) == status(second) == "completed"
    assert pid_of(first, "learner") == pid_of(second, "learner")
    assert warm_trial_number(second, "learner") == 2
    assert warm_trial_number(second, "generator-0") == 1  # the slot's replacement
    assert_same_metrics(grpo_two_steps, second)
