"""The zygote (harness.cli_zygote): cold component starts forked from a process that imported
torch and transformers once, and nothing a trial records may tell.

The first tests drive the real pieces (the session's zygote, which tests/conftest.py starts and
names in the environment, a `WarmChild` handing it a command) with a cheap command, `harness
config show`, against a cold `Child` running the same command. The end-to-end ones run a real
generator (stopped by SIGTERM; orphaned by a SIGKILLed supervisor), a trial started cold against
the shared trial the zygote forked, and `harness run` starting a zygote of its own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.config import load_config_data
from harness.launch.forked_child import ZYGOTE_ENV, zygote_from_env
from harness.launch.processes import Child, python_module_args
from harness.launch.warm_child import WarmChild
from harness.launch.warm_protocol import warm_components_from_env
from harness.launch.warm_slots import WarmPlan, WarmProcess, WarmSlots
from tests.harness.test_experiment import alive
from tests.harness.test_warm_components import config_show, finish, wait_until_dead
from tests.harness.trial_helpers import (
    REPO,
    SMALL_FIXED,
    assert_same_metrics,
    run_argv,
    trial_command,
)

FORKED_LINE = "forked by zygote"


def session_zygote() -> tuple[str, int]:
    zygote = zygote_from_env()
    assert zygote is not None, f"tests/conftest.py names the session's zygote in {ZYGOTE_ENV}"
    return zygote


def forked_child(name: str, args: list[str], log: Path, env: dict[str, str]) -> WarmChild:
    """A component as a supervisor's launcher makes it with no warm process but a zygote
    (harness.executors.local.LocalLauncher)."""
    return WarmChild(name, args, log, env, zygote=session_zygote())


def test_a_forked_start_runs_the_command_as_a_cold_start_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same output in the same 0600 log, same exit codes (a failure included), its own pid and
    session; the zygote outlives a failed component and forks its restart too."""
    monkeypatch.chdir(REPO)  # the relative config path resolves in the supervisor's directory
    _, zygote_pid = session_zygote()
    args = config_show("configs/quickstart.yaml", "learner.steps=7")
    cold = Child("learner", args, tmp_path / "cold" / "learner.log")
    forked = forked_child("learner", args, tmp_path / "forked" / "learner.log", {})
    cold.start()
    forked.start()
    assert forked.process is None and forked.pid not in (None, zygote_pid, os.getpid())
    assert os.getpgid(forked.pid) == forked.pid  # its own session: the supervisor's killpg
    assert (tmp_path / "forked/learner.pid").read_text() == str(forked.pid)
    assert finish(cold) == finish(forked) == 0
    forked_lines = forked.log_path.read_text().splitlines()
    assert forked_lines[0] == f"component process {forked.pid}: {FORKED_LINE} {zygote_pid}"
    assert forked_lines[1:] == cold.log_path.read_text().splitlines()
    assert "steps: 7" in forked.tail(lines=400)
    assert oct(forked.log_path.stat().st_mode & 0o777) == oct(0o600)

    failing = config_show("configs/no_such.yaml")
    cold = Child("learner", failing, tmp_path / "cold" / "again.log")
    forked = forked_child("learner", failing, tmp_path / "forked" / "again.log", {})
    for child in (cold, forked):
        child.start()
    assert finish(cold) == finish(forked) == 2
    assert forked.last_line() == cold.last_line() and "no_such.yaml" in forked.tail()
    first = forked.pid
    forked.start()  # a restart: forked again, by the same zygote
    assert forked.pid != first and forked.process is None and alive(zygote_pid)
    assert finish(forked) == 2


def test_a_warm_component_restarts_forked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm process serves the first start; its restart (the command failed, which ends the
    warm process) is forked by the zygote, not started cold."""
    monkeypatch.chdir(REPO)
    warm = WarmSlots(WarmPlan({"learner": ()}), slots=1, log_dir=tmp_path / "warm")
    try:
        _, env = warm.lease(dict(os.environ))
        assert ZYGOTE_ENV not in env  # a plan without a zygote adds none
        ((path, warm_pid),) = warm_components_from_env(env).values()
        log = tmp_path / "learner.log"
        child = WarmChild(
            "learner", config_show("configs/no_such.yaml"), log, {},
            socket_path=path, warm_pid=warm_pid, zygote=session_zygote(),
        )  # fmt: skip
        child.start()
        assert child.pid == warm_pid and finish(child) == 2
        child.start()
        assert child.process is None and child.pid not in (warm_pid, session_zygote()[1])
        assert finish(child) == 2
        assert f"component process {child.pid}: {FORKED_LINE}" in log.read_text()
    finally:
        warm.close()


def test_a_slot_forks_its_warm_processes_from_the_zygote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a zygote in the environment a slot's warm process is forked, not spawned: the
    zygote's child, in its own session, listening on the socket the slot made; it runs a
    command as a spawned one does, a failure ends it and its replacement is forked too; closing
    the slots ends it (the zygote kills what its requester let go)."""
    monkeypatch.chdir(REPO)
    _, zygote_pid = session_zygote()
    warm = WarmSlots(WarmPlan({"learner": ()}), slots=1, log_dir=tmp_path / "warm")
    try:
        index, env = warm.lease(dict(os.environ))
        ((path, warm_pid),) = warm_components_from_env(env).values()
        assert warm.forked == warm.spawned == 1
        assert psutil.Process(warm_pid).ppid() == zygote_pid
        assert os.getpgid(warm_pid) == warm_pid
        # the fork writes its log's first line once it runs (after the zygote's reply)
        first = _first_line(tmp_path / "warm" / "slot-0-learner.log")
        assert first == f"warm process {warm_pid}: {FORKED_LINE} {zygote_pid}"
        assert oct(Path(path).stat().st_mode & 0o777) == oct(0o600)
        log = tmp_path / "learner.log"
        child = WarmChild("learner", config_show("configs/quickstart.yaml", "learner.steps=7"),
                          log, {}, socket_path=path, warm_pid=warm_pid)  # fmt: skip
        child.start()
        assert child.pid == warm_pid and finish(child) == 0
        assert "steps: 7" in log.read_text()
        warm.release(index, keep=True)
        assert warm.pids(index) == {"learner": warm_pid} and alive(warm_pid)  # served on

        index, env = warm.lease(dict(os.environ))
        child = WarmChild("learner", config_show("configs/no_such.yaml"), log, {},
                          socket_path=path, warm_pid=warm_pid)  # fmt: skip
        child.start()
        assert finish(child) == 2
        wait_until_dead(warm_pid)
        warm.release(index, keep=True)  # dead: replaced, by a fork again
        (fresh,) = warm.pids(index).values()
        assert fresh != warm_pid and alive(fresh) and warm.forked == warm.spawned == 2
    finally:
        warm.close()
    wait_until_dead(fresh)
    assert alive(zygote_pid)


def _first_line(path: Path, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path} has no line after {timeout_s} s"
        time.sleep(0.05)
    return path.read_text().splitlines()[0]


def test_a_forked_warm_process_dies_with_the_run_that_asked_for_it(tmp_path: Path) -> None:
    """`harness run` SIGKILLed: its connection to the zygote closes and the zygote kills the
    warm processes forked for it at once, as PR_SET_PDEATHSIG kills spawned ones."""
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from harness.launch.warm_slots import WarmPlan, WarmSlots\n"
        "warm = WarmSlots(WarmPlan({'learner': ()}), slots=1, log_dir=Path(sys.argv[1]))\n"
        "index, env = warm.lease(dict(os.environ))\n"
        "print(warm.pids(index)['learner'], warm.forked, flush=True)\n"
        "time.sleep(600)\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "warm")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None
    warm_pid, forked = map(int, run.stdout.readline().split())
    assert forked == 1 and alive(warm_pid)
    run.kill()
    run.wait()
    wait_until_dead(warm_pid, timeout_s=10)
    assert alive(session_zygote()[1])


def test_the_zygote_ignores_a_bad_request_and_serves_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    path, zygote_pid = session_zygote()
    for garbage in (b"not json\n", b"[1, 2]\n", b""):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(path)
            conn.sendall(garbage)
            conn.shutdown(socket.SHUT_WR)
            assert conn.recv(100) == b""  # closed without a fork
    child = forked_child("learner", config_show("configs/quickstart.yaml"), tmp_path / "l.log", {})
    child.start()
    assert child.process is None and finish(child) == 0 and alive(zygote_pid)


def test_a_dead_zygote_means_a_cold_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Warmth saves time and never decides whether a component starts."""
    monkeypatch.chdir(REPO)
    zygote = WarmProcess.spawn_zygote(tmp_path / "z.sock", tmp_path / "z.log", dict(os.environ))
    zygote.kill()
    args = config_show("configs/quickstart.yaml")
    named = zygote_from_env(zygote.zygote_env)
    child = WarmChild("learner", args, tmp_path / "l.log", {}, zygote=named)
    child.start()
    assert child.process is not None and finish(child) == 0  # a cold Popen
    assert FORKED_LINE not in child.log_path.read_text()


@pytest.mark.e2e
def test_a_forked_generator_stops_on_sigterm_and_dies_with_its_supervisor(
    tmp_path: Path, redis_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (the supervisor's teardown) ends the generator as it ends a cold one (it finishes
    its round: exit 0); a supervisor SIGKILLed mid-trial takes its forked component with it, as
    PR_SET_PDEATHSIG takes a cold one, and the zygote lives on."""
    monkeypatch.chdir(REPO)
    path, zygote_pid = session_zygote()
    config = tmp_path / "exp.yaml"
    config.write_text(json.dumps(load_config_data(REPO / "configs/quickstart.yaml", SMALL_FIXED)))
    args = python_module_args(
        "harness.cli", "generator", str(config), "--arm", "grpo", "--seed", "0",
        "--lag", "0", "--out", str(tmp_path / "trial"), "--steps", "2", "--id", "gen-0",
    )  # fmt: skip
    env = {"HARNESS_REDIS_URL": redis_server.url, "HARNESS_RUN_ID": "zygote-test"}
    log = tmp_path / "trial" / "logs" / "generator-0.log"
    child = forked_child("generator-0", args, log, env)
    child.start()
    _wait_registered(redis_server.client(), "zygote-test", child)
    child.stop(timeout_s=30)
    assert child.poll() == 0, child.tail()
    assert not alive(child.pid) and alive(zygote_pid)

    # A supervisor (a real process, SIGKILLed) that had the zygote fork its generator.
    script = (
        "import ast, sys, time\n"
        "from pathlib import Path\n"
        "from harness.launch.warm_child import WarmChild\n"
        "args, log, env, path, pid = ast.literal_eval(sys.argv[1])\n"
        "child = WarmChild('generator-0', args, Path(log), env, zygote=(path, pid))\n"
        "child.start()\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {**env, "HARNESS_RUN_ID": "zygote-orphan"}
    spec = repr((args, str(log), env, path, zygote_pid))
    supervisor = subprocess.Popen(
        [sys.executable, "-c", script, spec], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert supervisor.stdout is not None
    forked = int(supervisor.stdout.readline())
    _wait_registered(redis_server.client(), "zygote-orphan", None)
    supervisor.kill()
    supervisor.wait()
    wait_until_dead(forked, timeout_s=10)
    assert alive(zygote_pid)


def _wait_registered(client, run_id: str, child: WarmChild | None) -> None:
    deadline = time.monotonic() + 120
    while not client.keys(f"*{run_id}*"):  # registered: waits for version 0 now
        assert child is None or child.poll() is None, child.tail()
        assert time.monotonic() < deadline, child.tail() if child else run_id
        time.sleep(0.2)


@pytest.mark.e2e
def test_a_cold_trial_equals_the_shared_trial_the_zygote_forked(
    grpo_lag1: Path, tmp_path: Path
) -> None:
    """The session's shared GRPO lag-1 trial ran with forked components; the same trial with
    cold ones (no zygote in its environment) computes the same metrics, bit for bit."""
    steps = 4
    for name in ("learner", "generator-0"):
        assert FORKED_LINE in (grpo_lag1 / "logs" / f"{name}.log").read_text()
    cold_env = {k: v for k, v in os.environ.items() if k != ZYGOTE_ENV}
    out = tmp_path / "cold"
    done = run_argv(trial_command(out, "grpo", steps=steps, lag=1), env=cold_env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert FORKED_LINE not in (out / "logs" / "learner.log").read_text()
    assert_same_metrics(grpo_lag1, out, steps)


@pytest.mark.e2e
@pytest.mark.parametrize("warm", [True, False], ids=["warm components", "cold components"])
def test_harness_run_forks_its_trials_components_from_a_zygote_of_its_own(
    tmp_path: Path, warm: bool
) -> None:
    """Without a zygote in its environment, `harness run` starts one: with warm components
    (the default) its slot's warm processes say they were forked by it, without them its
    trial's components do; it is gone when the run ends."""
    from tests.harness.test_ray_executor import _write_config  # a config of the quickstart's

    config = _write_config(
        tmp_path / "exp.yaml",
        [*SMALL_FIXED, "arms=[{name: gspo, objective: gspo}]", "seeds=[0]"],
    )
    env = {k: v for k, v in os.environ.items() if k != ZYGOTE_ENV}
    argv = [sys.executable, "-m", "harness.cli", "run", str(config), "--out", str(tmp_path / "x")]
    done = run_argv([*argv, "--steps", "2", f"executor.warm_components={warm}"], env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    warm_dir = tmp_path / "x" / "warm_components"
    ready = (warm_dir / "zygote.log").read_text().split()
    zygote_pid = int(ready[ready.index("zygote") + 1].rstrip(":"))
    _, session_pid = session_zygote()
    assert zygote_pid != session_pid and not alive(zygote_pid)
    (trial,) = (tmp_path / "x" / "trials").iterdir()
    for name in ("learner", "generator-0"):
        log = (trial / "logs" / f"{name}.log").read_text()
        if warm:  # served by the slot's warm process, which the zygote forked
            assert "warm component process" in log and FORKED_LINE not in log
            first = (warm_dir / f"slot-0-{name}.log").read_text().splitlines()[0]
            assert first.startswith("warm process ") and first.endswith(
                f"{FORKED_LINE} {zygote_pid}"
            )
        else:
            assert f"{FORKED_LINE} {zygote_pid}" in log
