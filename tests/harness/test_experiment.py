"""The scheduler, progress tail and `harness run` on real processes (the grid: test_grid.py).

Scheduling tests replace the trial command by tests/harness/fake_trial.py, a small real
program that writes the trial-runner files (trial.json, metrics parts, prompts); the scheduler,
process groups, signals, resume and MLflow logging under test are the real ones.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from rich.console import Console

from contract.record import TrialRecord
from harness.config import ExperimentConfig, load_config
from harness.experiment.grid import expand_trials
from harness.experiment.progress import MetricsTail
from harness.experiment.run import ExperimentRequest, run_experiment
from harness.launch.pool import SubprocessTrialPool
from harness.launch.trials import PoolLimits, exit_status, trial_command
from learner.runtime.metrics_log import MetricsLog
from tests.harness.mlflow_store import fresh_sqlite_store, template_store

FAKE_TRIAL = Path(__file__).with_name("fake_trial.py")
FAKE_PREFIX = (sys.executable, str(FAKE_TRIAL))
PARENT_TAG = "mlflow.parentRunId"


@pytest.fixture(scope="session")
def mlflow_template(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return template_store(request.config, tmp_path_factory)


def config_data(root: Path, **extra: object) -> dict:
    data = {
        "name": "exp",
        "seeds": [0, 1],
        "arms": [{"name": "gspo", "objective": "gspo"}, {"name": "grpo", "objective": "grpo"}],
        "output_dir": str(root),
        "learner": {"steps": 3},
        "tracking": {"enabled": False},
    }
    return data | extra


def write_config(root: Path, **extra: object) -> tuple[ExperimentConfig, Path]:
    path = root / "exp.yaml"
    path.write_text(json.dumps(config_data(root, **extra)))  # JSON is valid YAML
    return load_config(path), path


def quiet() -> Console:
    return Console(file=io.StringIO(), width=120)


def run(
    cfg: ExperimentConfig,
    path: Path,
    *,
    max_parallel: int | None = None,
    steps: int | None = None,
    **kwargs: object,
):
    command = trial_command(path, (), steps, prefix=FAKE_PREFIX)
    kwargs.setdefault("report", False)
    request = ExperimentRequest(cfg, path, None, (), max_parallel, steps)
    return run_experiment(request, console=quiet(), command=command, **kwargs)


def attempts(trial_dir: Path) -> list[dict]:
    path = trial_dir / "attempts.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def alive(pid: int) -> bool:
    """True for a live process; a zombie (exited, not yet reaped by init) counts as dead."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for name in ("FAKE_FAIL_ARMS", "FAKE_DIVERGE_ARMS", "FAKE_HANG", "FAKE_LEAK", "FAKE_ESCAPE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("FAKE_STEP_S", raising=False)


# --- grid -----------------------------------------------------------------------------------


IDENTITY = {"arm": "gspo", "seed": 0, "lag": 0, "mode": "fixed"}  # of expand_trials(...)[0]


def write_json(trial_dir: Path, **info: object) -> None:
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "trial.json").write_text(json.dumps(info))


def test_exit_status_follows_the_runner_contract() -> None:
    def record(status: str, **more: object) -> TrialRecord:
        return TrialRecord.model_validate({**IDENTITY, "status": status, **more})

    assert exit_status(0, record("completed")) == ("completed", "completed")
    assert exit_status(0, record("diverged", diverged_reason="nan")) == (
        "diverged",
        "diverged: nan",
    )
    assert exit_status(0, record("running")) == (
        "failed",
        "exited 0 but trial.json says status 'running'",
    )
    assert exit_status(0, None)[0] == "failed"
    assert exit_status(3, record("completed")) == ("failed", "exit code 3")
    assert exit_status(-9, None) == ("failed", "killed by signal 9")


def test_trial_command_argv(tmp_path: Path) -> None:
    spec = expand_trials(ExperimentConfig.model_validate(config_data(tmp_path)))[1]
    build = trial_command(Path("exp.yaml"), ["learner.lr=0.1"], steps=7)
    argv = build(spec, True)
    assert argv[:4] == [sys.executable, "-m", "harness.cli", "trial"]
    assert argv[4] == str(Path("exp.yaml").resolve())
    assert argv[5:] == [
        "--arm", "grpo", "--seed", "0", "--lag", "0", "--mode", "fixed",
        "--out", str(spec.trial_dir), "--steps", "7", "--resume", "learner.lr=0.1",
    ]  # fmt: skip
    assert "--resume" not in build(spec, False)


# --- progress -------------------------------------------------------------------------------


def test_metrics_tail_reads_new_parts_and_follows_truncation(tmp_path: Path) -> None:
    tail = MetricsTail(tmp_path)
    tail.poll()  # no metrics dir yet: nothing, no error
    assert tail.steps_done == 0 and tail.summary() == "reward -  pass -"
    log = MetricsLog(tmp_path)
    log.append(1, 1.0, {"reward/mean": 0.5, "eval/pass_rate": 0.25})
    log.append(2, 2.0, {"reward/mean": 0.75, "eval/pass_rate": float("nan")})
    tail.poll()
    # pass rate keeps the last non-NaN value (step 1) while reward moves on to step 2
    assert (tail.steps_done, tail.latest) == (2, {"reward/mean": 0.75, "eval/pass_rate": 0.25})
    (tmp_path / "metrics.parquet" / "part-000001.parquet").write_bytes(b"garbage")
    log.append(3, 3.0, {"reward/mean": 1.0})
    tail.poll()  # only part 3 is new: the (now corrupt) part 1 is not read again
    assert tail.steps_done == 3 and tail.latest["reward/mean"] == 1.0
    log.truncate_after(1)  # a resumed learner drops steps newer than its checkpoint
    tail.poll()
    assert tail.steps_done == 0  # part 1 is unreadable now; parts 2, 3 are gone


# --- scheduling on real processes -----------------------------------------------------------


def intervals_overlap(trial_dirs: list[Path]) -> int:
    """Largest number of fake trials that were running at the same moment."""
    events = []
    for trial_dir in trial_dirs:
        for attempt in attempts(trial_dir):
            finished = (trial_dir / "metrics.parquet").stat().st_mtime
            events += [(attempt["start"], 1), (finished, -1)]
    running = peak = 0
    for _, change in sorted(events):
        running += change
        peak = max(peak, running)
    return peak


def test_runs_at_most_max_parallel_and_continues_after_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_STEP_S", "0.15")
    monkeypatch.setenv("FAKE_FAIL_ARMS", "grpo")
    cfg, path = write_config(tmp_path)
    result = run(cfg, path, max_parallel=2)
    by_name = {t.spec.trial_name: t for t in result.trials}
    assert {n: t.status for n, t in by_name.items()} == {
        "gspo__seed0__lag0__fixed": "completed",
        "grpo__seed0__lag0__fixed": "failed",
        "gspo__seed1__lag0__fixed": "completed",
        "grpo__seed1__lag0__fixed": "failed",
    }
    assert by_name["grpo__seed0__lag0__fixed"].message == "exit code 3"
    assert result.exit_code == 1
    specs = expand_trials(cfg)
    log = (specs[1].trial_dir / "trial.log").read_text()
    assert "=== harness" in log and "failing on purpose" in log
    assert intervals_overlap([s.trial_dir for s in specs]) <= 2


def test_relaunch_skips_done_resumes_unfinished_and_starts_new(tmp_path: Path) -> None:
    cfg, path = write_config(tmp_path)
    done, failed, killed, new = expand_trials(cfg)
    write_json(done.trial_dir, **IDENTITY, status="completed")
    write_json(failed.trial_dir, **(IDENTITY | {"arm": "grpo"}), status="failed")
    write_json(killed.trial_dir, **(IDENTITY | {"seed": 1}), status="running")
    MetricsLog(failed.trial_dir).append(1, 1.0, {"reward/mean": 0.1})
    result = run(cfg, path, max_parallel=3)
    assert result.exit_code == 0
    assert [(t.spec.trial_name, t.skipped, t.resumed) for t in result.trials] == [
        (done.trial_name, True, False),
        (failed.trial_name, False, True),
        (killed.trial_name, False, True),
        (new.trial_name, False, False),
    ]
    assert attempts(done.trial_dir) == []
    assert [a["resume"] for a in attempts(failed.trial_dir)] == [True]
    assert "--resume" in attempts(killed.trial_dir)[0]["argv"]
    assert [a["resume"] for a in attempts(new.trial_dir)] == [False]
    assert MetricsLog(failed.trial_dir).steps() == [1, 2, 3]  # continued from its step 1


def test_divergence_is_a_result_and_leftover_processes_are_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_DIVERGE_ARMS", "grpo")
    monkeypatch.setenv("FAKE_LEAK", "1")  # completed trials leave a sleeping grandchild behind
    cfg, path = write_config(tmp_path, seeds=[0])
    result = run(cfg, path, max_parallel=2, kill_grace_s=2.0)
    statuses = {t.spec.arm: (t.status, t.message) for t in result.trials}
    assert statuses["grpo"] == ("diverged", "diverged: grad not finite")
    assert statuses["gspo"][0] == "completed" and "left processes behind" in statuses["gspo"][1]
    assert result.exit_code == 0
    leaked = int((expand_trials(cfg)[0].trial_dir / "pids.txt").read_text().split()[1])
    assert not alive(leaked)


def wait_for_files(paths: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {paths}")
        time.sleep(0.05)


def test_trial_timeout_kills_the_trial_and_its_escaped_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HANG", "1")
    monkeypatch.setenv("FAKE_ESCAPE", "1")  # the grandchild is in its own session
    cfg, path = write_config(tmp_path, seeds=[0], arms=[{"name": "gspo", "objective": "gspo"}])
    (spec,) = expand_trials(cfg)
    command = trial_command(path, prefix=FAKE_PREFIX)
    limits = PoolLimits(max_parallel=1, kill_grace_s=1.0, trial_timeout_s=600)
    with SubprocessTrialPool(command, limits) as pool:
        pool.start(spec, resume=False)
        wait_for_files([spec.trial_dir / "pids.txt"], timeout_s=60)  # now it hangs
        assert pool.reap() == []
        pool.trial_timeout_s = 0.5  # as if it had been hanging for longer than its limit
        time.sleep(0.5)
        (done,) = pool.reap()
    assert done.status == "failed" and "timed out after 0.5 s" in done.message
    pids = [int(p) for p in (spec.trial_dir / "pids.txt").read_text().split()]
    assert not any(alive(pid) for pid in pids)


def signal_when_started(pid_files: list[Path], signum: int, timeout_s: float) -> threading.Thread:
    """Send `signum` to this process once every trial wrote its pids (they then hang)."""

    def send() -> None:
        deadline = time.monotonic() + timeout_s
        while not all(p.exists() for p in pid_files):
            if time.monotonic() > deadline:
                return  # the test then fails on the trial timeout, not by hanging
            time.sleep(0.05)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(("signum", "tracked"), [(signal.SIGTERM, True), (signal.SIGINT, False)])
def test_signal_stops_every_trial_group_and_relaunch_resumes(
    tmp_path: Path,
    mlflow_template: Path,
    monkeypatch: pytest.MonkeyPatch,
    signum: int,
    tracked: bool,
) -> None:
    """Ctrl-C / SIGTERM reach `harness run` (here: this process, which runs it in its main
    thread); every trial runner and the grandchild it started must be gone afterwards."""
    cfg, path = write_config(tmp_path, seeds=[0], max_parallel=2, tracking={"enabled": tracked})
    specs = expand_trials(cfg)
    fresh_sqlite_store(specs[0].trial_dir.parents[1], mlflow_template)
    monkeypatch.setenv("FAKE_HANG", "1")
    monkeypatch.setenv("FAKE_ESCAPE", "1")  # grandchildren in their own sessions, like the runner's
    pid_files = [s.trial_dir / "pids.txt" for s in specs]
    sender = signal_when_started(pid_files, signum, timeout_s=60)
    first = run(cfg, path, kill_grace_s=1.0, trial_timeout_s=90.0)
    sender.join(timeout=5)
    assert first.interrupted_by == signum and first.exit_code == 128 + signum
    assert [t.status for t in first.trials] == ["interrupted", "interrupted"]
    pids = [int(p) for f in pid_files for p in f.read_text().split()]
    assert len(pids) == 4 and not any(alive(pid) for pid in pids)
    statuses = {json.loads((s.trial_dir / "trial.json").read_text())["status"] for s in specs}
    assert statuses == {"running"}

    monkeypatch.delenv("FAKE_HANG")
    result = run(cfg, path)  # the same launch again resumes both trials
    assert [(t.status, t.resumed) for t in result.trials] == [("completed", True)] * 2
    if not tracked:
        return
    client = MlflowClient(tracking_uri=result.tracking_uri)
    experiment = client.get_experiment_by_name("exp")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if PARENT_TAG not in r.data.tags]
    children = [r for r in runs if PARENT_TAG in r.data.tags]
    assert len(parents) == 2 and len(children) == 2  # the killed attempt's runs were reused
    assert {c.data.tags[PARENT_TAG] for c in children} == {result.parent_run_id}
    assert {(c.info.status, c.data.tags["status"]) for c in children} == {("FINISHED", "completed")}
    killed_parent = next(p for p in parents if p.info.run_id != result.parent_run_id)
    assert killed_parent.info.status == "KILLED"
    steps = [len(client.get_metric_history(c.info.run_id, "reward/mean")) for c in children]
    assert steps == [3, 3]


def test_report_is_built_and_logged(tmp_path: Path, mlflow_template: Path) -> None:
    cfg, path = write_config(
        tmp_path, tracking={"enabled": True}, learner={"steps": 4}, report={"n_resamples": 2000}
    )
    fresh_sqlite_store(expand_trials(cfg)[0].trial_dir.parents[1], mlflow_template)
    result = run(cfg, path, max_parallel=4, report=True)
    assert result.report_error is None and result.exit_code == 0
    assert result.report_paths["markdown"].is_file()
    assert result.report_paths["html"].is_file()
    client = MlflowClient(tracking_uri=result.tracking_uri)
    files = {f.path for f in client.list_artifacts(result.parent_run_id, "report")}
    assert "report/report.md" in files and "report/report.html" in files


DRIVER = """
import sys, time
from pathlib import Path
from harness.experiment.grid import expand_trials
from harness.launch.pool import SubprocessTrialPool
from harness.launch.trials import PoolLimits, trial_command
from tests.harness.test_experiment import FAKE_PREFIX, write_config

root = Path(sys.argv[1])
cfg, path = write_config(root, seeds=[0], arms=[{"name": "gspo", "objective": "gspo"}])
(spec,) = expand_trials(cfg)
command = trial_command(path, prefix=FAKE_PREFIX)
pool = SubprocessTrialPool(command, PoolLimits(max_parallel=1, kill_grace_s=1.0))
pool.start(spec, resume=False)
print(spec.trial_dir, flush=True)
time.sleep(600)
"""


def test_a_sigkilled_driver_takes_its_trial_runners_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kill -9` of `harness run` runs no teardown; without PR_SET_PDEATHSIG its trials went on,
    and the re-run started a second supervisor on the same trial directory."""
    monkeypatch.setenv("FAKE_HANG", "1")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        text=True,
    )
    trial_dir = Path(driver.stdout.readline().strip())
    wait_for_files([trial_dir / "pids.txt"], timeout_s=60)
    runner, grandchild = (int(p) for p in (trial_dir / "pids.txt").read_text().split())
    driver.kill()
    driver.wait(timeout=10)
    deadline = time.monotonic() + 10
    while alive(runner) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not alive(runner), "the trial runner outlived its SIGKILLed driver"
    finally:
        for pid in (runner, grandchild):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
