"""executor.cpu_sets: a trial's learner and generators pinned to disjoint CPU sets.

The config tests check each refusal in one line naming the field; the launch tests start real
processes (a cold component through the local launcher, a warm process through its socket) and
read their masks back from the kernel, every thread of them; the CPU-share metrics are measured
on this process. The end-to-end check reads the shared vLLM experiment (VLLM_ARMS), whose learner
and generator are pinned to two CPUs and re-pinned at each of their eight warm trials.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from contract import metrics as M
from harness.config import ConfigError, load_config, resolved_dump
from harness.cpu_lists import format_cpu_list, parse_cpu_list
from harness.executors import open_executor
from harness.executors.local import LocalLauncher
from harness.launch.affinity import (
    PINNED_LINE,
    available_cpus,
    check_cpu_sets,
    component_cpus,
    pin_all_threads,
    pinned_line,
    thread_cpus,
    thread_warnings,
)
from harness.launch.processes import python_module_args
from harness.launch.warm_child import WarmChild
from harness.launch.warm_protocol import WARM_COMPONENTS_ENV, warm_components_from_env
from harness.launch.warm_slots import WarmPlan, WarmSlots
from harness.signals import SignalLatch
from harness.trial.rollout_groups import GeneratorStats
from learner.runtime.step_metrics import CpuShare
from tests.harness.trial_helpers import REPO

QUICKSTART = REPO / "configs/quickstart.yaml"
CPUS = sorted(available_cpus())
two_cpus = pytest.mark.skipif(
    len(CPUS) < 2, reason="pinning two components apart needs 2 CPUs; this machine lends 1"
)


def pinned(learner: str, generators: str, *extra: str) -> list[str]:
    return [f"executor.cpu_sets={{learner: '{learner}', generators: {generators}}}", *extra]


def refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(QUICKSTART, overrides)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


# --- the option in the config -------------------------------------------------------------


def test_cpu_lists_read_and_print_as_taskset_writes_them() -> None:
    assert parse_cpu_list("0-2,5, 7-8") == {0, 1, 2, 5, 7, 8}
    assert format_cpu_list(frozenset({0, 1, 2, 5, 7, 8})) == "0-2,5,7-8"
    assert format_cpu_list(frozenset({3})) == "3"
    for bad in ("", "a", "1-", "-1", "3-1", "0,,1"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


def test_unset_changes_nothing_and_a_set_one_is_kept_but_not_hashed() -> None:
    plain = load_config(QUICKSTART)
    assert plain.executor.cpu_sets is None
    assert "cpu_sets" not in resolved_dump(plain)["executor"]  # OMITTED_AT_DEFAULT's row
    assert plain.model_dump()["executor"]["cpu_sets"] is None  # model_dump stays pydantic's
    cfg = load_config(QUICKSTART, ["executor.cpu_sets={learner: 0, generators: 1}"])
    assert cfg.executor.cpu_sets is not None
    assert resolved_dump(cfg)["executor"]["cpu_sets"] == {"learner": "0", "generators": ["1"]}
    assert cfg.config_hash() == plain.config_hash()  # where a trial runs changes no result
    # the resolved config (what each trial directory keeps) reads back to the same sets
    assert load_config_from_dump(resolved_dump(cfg)).executor.cpu_sets == cfg.executor.cpu_sets


def load_config_from_dump(data: dict) -> object:
    from harness.config import validate_config

    return validate_config(yaml.safe_load(yaml.safe_dump(data)))


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [
        (pinned("a", "['1']"), "executor.cpu_sets.learner", "not a CPU list"),
        (pinned("0", "['2-1']"), "executor.cpu_sets.generators", "runs backwards"),
        (pinned("0", "[]"), "executor.cpu_sets.generators", "at least 1"),
        (pinned("0-1", "['1']"), "executor.cpu_sets", "must be disjoint"),
        (
            pinned("0", "['1-2', '2-3']", "generation.num_generators=2"),
            "executor.cpu_sets",
            "generators[0] and generators[1] share CPUs 2",
        ),
        (pinned("0", "['1']", "executor.kind=ray"), "executor", "executor.learner.cpus"),
        (["executor.cpu_sets={learner: '0'}"], "executor.cpu_sets.generators", "required"),
    ],
)
def test_refused_in_one_line_naming_the_field(overrides: list[str], field: str, says: str) -> None:
    message = refusal(overrides)
    assert f"{field}:" in message and says in message, message


def test_the_machine_checks_come_when_a_run_or_trial_starts() -> None:
    """The number of generator sets is checked with the config; the CPUs lent where the
    components start (a config is also read by pinned components and on other machines); one
    line each."""
    with pytest.raises(ConfigError, match=r"executor\.cpu_sets\.generators has 2 CPU sets for "):
        load_config(QUICKSTART, pinned("0", "['1', '2']", "generation.num_generators=3"))
    absent = max(CPUS) + 1
    cfg = load_config(QUICKSTART, pinned(str(CPUS[0]), f"['{absent}']"))
    with pytest.raises(ConfigError, match=rf"names CPUs {absent}, which this machine does not"):
        check_cpu_sets(cfg)
    executor = open_executor(cfg.executor)
    refused = pytest.raises(ConfigError, match=r"executor\.cpu_sets names CPUs")
    with refused, executor.components(1, SignalLatch()):  # a trial's supervisor refuses too
        pass


@two_cpus
def test_components_get_their_sets_one_shared_set_serves_every_generator() -> None:
    learner, gen = CPUS[0], CPUS[1]
    cfg = load_config(
        QUICKSTART,
        pinned(str(learner), f"'{gen}'", "generation.num_generators=2", "generation.threads=1"),
    )
    assert component_cpus(cfg.executor.cpu_sets, 2) == {
        "learner": {learner},
        "generator-0": {gen},
        "generator-1": {gen},
    }
    # two generators of one thread each on one CPU, and a 2-thread learner on one: warned
    threaded = load_config(
        QUICKSTART,
        pinned(str(learner), f"'{gen}'", "generation.num_generators=2", "learner.threads=2"),
    )
    warnings = thread_warnings(threaded)
    assert any("the learner runs 2 threads" in w for w in warnings), warnings
    assert any("for 2 generator threads" in w for w in warnings), warnings
    assert thread_warnings(load_config(QUICKSTART, pinned(str(learner), f"['{gen}']"))) == []


# --- real processes -------------------------------------------------------------------------

# A component stand-in: a second thread, then its own view of its mask, then it waits.
STAND_IN = (
    "import os, threading, time; "
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); "
    "print('mask', sorted(os.sched_getaffinity(0)), flush=True); time.sleep(60)"
)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@two_cpus
def test_a_cold_component_starts_pinned_every_thread_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(WARM_COMPONENTS_ENV, raising=False)  # cold: no warm process to use
    cpu = frozenset({CPUS[1]})
    launcher = LocalLauncher({"generator-0": cpu})
    log = tmp_path / "logs" / "generator-0.log"
    child = launcher.child("generator-0", [sys.executable, "-c", STAND_IN], log, {})
    unpinned = launcher.child("learner", [sys.executable, "-c", STAND_IN], tmp_path / "l.log", {})
    try:
        child.start()
        unpinned.start()
        assert child.pid is not None and unpinned.pid is not None
        wait_for(lambda: "mask" in log.read_text())
        threads = thread_cpus(child.pid)
        assert len(threads) >= 2 and set(threads.values()) == {cpu}, threads
        text = log.read_text()
        assert pinned_line("generator-0", child.pid, cpu) in text
        assert f"mask [{CPUS[1]}]" in text  # what the child itself saw, before its imports
        assert frozenset(os.sched_getaffinity(unpinned.pid)) == available_cpus()
    finally:
        child.stop(timeout_s=2)
        unpinned.stop(timeout_s=2)


@pytest.fixture
def one_slot(tmp_path: Path) -> Iterator[WarmSlots]:
    """One slot keeping a `generator-0` process that preloads nothing (cheap, real)."""
    warm = WarmSlots(WarmPlan({"generator-0": ()}), slots=1, log_dir=tmp_path / "warm")
    yield warm
    warm.close()


def run_warm(
    slot: WarmSlots, log: Path, cpus: frozenset[int] | None
) -> tuple[int, dict[int, frozenset[int]]]:
    """One assignment (`harness config show`) for the slot's warm process; its pid and the
    masks of its threads once the assignment is done (the process lives on)."""
    index, env = slot.lease(dict(os.environ))
    path, pid = warm_components_from_env(env)["generator-0"]
    args = python_module_args("harness.cli", "config", "show", str(QUICKSTART))
    child = WarmChild("generator-0", args, log, {}, cpus=cpus, socket_path=path, warm_pid=pid)
    child.start()
    wait_for(lambda: child.poll() is not None, timeout_s=60)
    assert child.poll() == 0, child.tail()
    slot.release(index, keep=True)
    return pid, thread_cpus(pid)


@two_cpus
def test_a_warm_process_is_pinned_at_each_assignment_and_unpinned_after(
    one_slot: WarmSlots, tmp_path: Path
) -> None:
    cpu = frozenset({CPUS[1]})
    log = tmp_path / "logs" / "generator-0.log"
    pid, masks = run_warm(one_slot, log, cpu)
    assert set(masks.values()) == {cpu}, masks  # every thread it has
    assert pinned_line("generator-0", pid, cpu) in log.read_text()
    # the next trial of the slot asks for no pinning: the mask it started with comes back
    again, masks = run_warm(one_slot, tmp_path / "logs" / "second.log", None)
    assert again == pid and set(masks.values()) == {available_cpus()}, masks
    assert PINNED_LINE not in (tmp_path / "logs" / "second.log").read_text()


@two_cpus
def test_pinning_a_running_process_reaches_the_threads_it_already_has() -> None:
    """What a warm process does at each assignment: its earlier trials' threads (torch's
    pools, an engine's) are pinned too, not only the thread that asks."""
    started_on = available_cpus()
    release = threading.Event()
    worker = threading.Thread(target=release.wait, daemon=True)
    worker.start()
    cpu = frozenset({CPUS[1]})
    try:
        pin_all_threads(cpu)
        masks = thread_cpus(os.getpid())
        assert masks[worker.native_id] == cpu and masks[threading.get_native_id()] == cpu
    finally:
        pin_all_threads(started_on)
        release.set()
    assert set(thread_cpus(os.getpid()).values()) == {started_on}


# --- the CPU-share metrics ------------------------------------------------------------------


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def own_share(since: tuple[float, float], cpus: int) -> float:
    """This process's CPU seconds over wall seconds x cpus since `since` (wall, cpu)."""
    wall, cpu = time.perf_counter(), time.process_time()
    return (cpu - since[1]) / ((wall - since[0]) * cpus)


def test_cpu_shares_count_this_process_over_its_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    # Checked against the process's own clocks around the same window, not against "one busy
    # thread is one whole CPU": on shared cores (CI, a suite next to other work) the busy thread
    # gets less than a core, and the metric must say so.
    cpus = len(available_cpus())
    since = (time.perf_counter(), time.process_time())
    stats = GeneratorStats()
    busy(0.3)
    gen = stats.as_metrics()[M.PERF_GEN_CPU_FRAC]
    assert 0.0 < gen <= 1.0 + 0.05, gen
    assert gen == pytest.approx(own_share(since, cpus), rel=0.05, abs=1e-3)
    assert M.reduction(M.PERF_GEN_CPU_FRAC) == M.reduction(M.PERF_LEARNER_CPU_FRAC) == "mean"

    share = CpuShare()
    monkeypatch.delenv("HARNESS_RUN_ID", raising=False)
    assert share.share() is None  # not a trial's component: nothing to measure
    monkeypatch.setenv("HARNESS_RUN_ID", "run-a")
    assert share.share() is None  # a trial's first row: no window yet
    since = (time.perf_counter(), time.process_time())
    busy(0.3)
    learner = share.share()
    assert learner is not None and 0.0 < learner <= 1.0 + 0.05, learner
    assert learner == pytest.approx(own_share(since, cpus), rel=0.05, abs=1e-3)
    monkeypatch.setenv("HARNESS_RUN_ID", "run-b")  # the next trial of a warm process
    assert share.share() is None


# --- end to end: the shared vLLM experiment, pinned ----------------------------------------


@two_cpus
@pytest.mark.e2e
def test_the_shared_experiment_ran_pinned_and_recorded_it(vllm_arms: Path) -> None:
    learner, generator = frozenset({CPUS[0]}), frozenset({CPUS[1]})
    trials = sorted(path for path in (vllm_arms / "trials").iterdir() if path.is_dir())
    assert len(trials) == 5  # four objectives at lag 0, GRPO at lag 1 too
    for trial in trials:
        resolved = yaml.safe_load((trial / "resolved_config.yaml").read_text())
        assert resolved["executor"]["cpu_sets"] == {
            "learner": str(CPUS[0]),
            "generators": [str(CPUS[1])],
        }
        facts = json.loads((trial / "trial.json").read_text())["provenance"]["hardware"]
        assert facts["cpu_affinity"] == format_cpu_list(available_cpus())
        for component, cpus in (("learner", learner), ("generator-0", generator)):
            pid = int((trial / "logs" / f"{component}.pid").read_text())
            line = pinned_line(component, pid, cpus)
            assert line in (trial / "logs" / f"{component}.log").read_text(), (trial, component)
