"""`harness run` on a real two-node Ray cluster (ray.cluster_utils.Cluster on this machine).

The head node carries the custom resource `node_head`, the worker `node_worker`, so a config
can pin a component to either. Tests run in file order and the last one kills the worker node.
No mocks: real Ray, real trials (torch generator, fixed mode), real Redis. The local run the
Ray executor must match is the session's shared `gspo_two_seeds` experiment (4 steps, of which
the Ray run's first STEPS; tests/harness/conftest.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from ray._raylet import Config as RayConfig
from ray.cluster_utils import Cluster

from contract.layout import TrialPaths
from contract.record import read_trial_record
from harness.config import load_config, load_config_data
from harness.experiment.run import ExperimentRequest, run_experiment
from harness.storage.remote_tree import RemoteTree
from harness.storage.trial_storage import Storage
from learner.runtime.metrics_log import MetricsLog
from tests.harness.shared_trials import GSPO_TWO_SEEDS
from tests.harness.trial_helpers import REPO, SMALL_FIXED, assert_same_metrics, process_alive
from tests.s3 import S3Server

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

STEPS = 2
BASE = SMALL_FIXED
ONE_TRIAL = ["arms=[{name: gspo, objective: gspo}]", "seeds=[0]", "max_parallel=1"]
TWO_SEEDS = ["arms=[{name: gspo, objective: gspo}]", "seeds=[0, 1]"]
# The shared local run is this configuration, run for at least STEPS steps (with cold component
# processes; the executor is not part of a config).
COLD = "executor.warm_components=false"
assert (*BASE, *TWO_SEEDS, COLD) == GSPO_TWO_SEEDS.overrides and GSPO_TWO_SEEDS.steps >= STEPS
# Ray's process names: node services, and workers (renamed `ray::<actor>` once busy).
RAY_NAMES = (
    "raylet",
    "gcs_server",
    "plasma_store",
    "log_monitor",
    "dashboard",
    "ray::",
    "default_worker",
)


def _write_config(path: Path, overrides: list[str], executor: dict[str, Any] | None = None) -> Path:
    data = load_config_data(REPO / "configs/quickstart.yaml", overrides)
    if executor is not None:
        data["executor"] = executor
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(config: Path, out: Path | str, steps: int, max_parallel: int = 1) -> Any:
    cfg = load_config(config)
    return run_experiment(
        ExperimentRequest(cfg, config, out, (), max_parallel, steps), report=False
    )


def _placements(trial_dir: Path) -> dict[str, list[str]]:
    """Component -> the Ray node ids it was started on, in order (from trial.log)."""
    found: dict[str, list[str]] = {}
    for line in TrialPaths(trial_dir).trial_log.read_text().splitlines():
        name, sep, rest = line.partition(": started on Ray node ")
        if sep:
            found.setdefault(name, []).append(rest.split()[0])
    return found


def _is_ray(proc: psutil.Process) -> bool:
    try:
        text = proc.name() + " " + " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return any(name in text for name in RAY_NAMES)


def _assert_all_gone(procs: list[psutil.Process], timeout_s: float = 30.0) -> None:
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    described = []
    for proc in alive:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            continue
    assert not described, "processes survived:\n" + "\n".join(described)


@pytest.fixture(scope="module")
def cluster(s3_server: S3Server) -> Iterator[Cluster]:
    """Head (2 CPUs, `node_head`) + worker (2 CPUs, `node_worker`); fast node-death detection.

    The S3 server (session-wide, for the bucket tests) starts first, so the scan below does not
    take it for a process of this cluster.

    Token authentication as Ray enables it for new clusters, with a token of this module only;
    the trials' subprocesses inherit it. On teardown every process started below this one since
    (raylets, GCS, Ray workers, their component processes, trial runners, Redis) must be gone.
    """
    before = {proc.pid for proc in psutil.Process().children(recursive=True)}
    saved = {key: os.environ.get(key) for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    RayConfig.initialize("")  # Ray read RAY_AUTH_MODE at import; re-read it, as ray.init does
    fast = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
    head = {"num_cpus": 2, "resources": {"node_head": 1}, "_system_config": fast}
    ray_cluster = Cluster(initialize_head=True, head_node_args=head)
    ray_cluster.add_node(num_cpus=2, resources={"node_worker": 1})
    ray_cluster.wait_for_nodes()
    try:
        yield ray_cluster
    finally:
        started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        saw_ray = any(_is_ray(p) for p in started)
        ray_cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        assert saw_ray  # the scan did see the cluster's processes
        _assert_all_gone(started)


def test_ray_matches_local_with_generators_on_the_other_node(
    tmp_path: Path, cluster: Cluster, gspo_two_seeds: Path
) -> None:
    """2 seeds run at once: the same metrics as the local executor (the shared run, read-only),
    every learner on the head node and every generator on the worker node."""
    local = gspo_two_seeds
    on_ray = _write_config(
        tmp_path / "ray.yaml",
        [*BASE, *TWO_SEEDS],
        executor={
            "kind": "ray",
            "address": cluster.address,
            "learner": {"cpus": 0.5, "resources": {"node_head": 0.01}},
            "generator": {"cpus": 0.5, "resources": {"node_worker": 0.01}},
        },
    )
    # both trials at once (two placement groups): on 2 cores that overlaps their start-up
    second = _run(on_ray, tmp_path / "ray", STEPS, max_parallel=2)
    assert second.exit_code == 0
    assert [t.status for t in second.trials] == ["completed"] * 2
    head, worker = cluster.head_node.node_id, next(iter(cluster.worker_nodes)).node_id
    for trial in second.trials:
        name = trial.spec.trial_name
        assert_same_metrics(local / "trials" / name, trial.spec.trial_dir, steps=STEPS)
        assert _placements(trial.spec.trial_dir) == {"learner": [head], "generator-0": [worker]}
        config = yaml.safe_load(trial.spec.paths.resolved_config.read_text())
        assert config["executor"]["kind"] == "ray"
    # the executor is not part of the trial's identity: both runs record the same config hash
    trial_dirs = [*sorted((local / "trials").iterdir()), *(t.spec.trial_dir for t in second.trials)]
    assert len(trial_dirs) == 4
    hashes = {read_trial_record(trial_dir).config_hash for trial_dir in trial_dirs}
    assert len(hashes) == 1


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _cmdlines(procs: list[psutil.Process]) -> str:
    text = []
    for proc in procs:
        try:
            text.append(proc.name() + " " + " ".join(proc.cmdline()))
        except psutil.Error:
            continue
    return "\n".join(text)


def _wait_for_step(process: subprocess.Popen, trial_dir: Path, step: int) -> None:
    """Until `harness run` (still running) has logged `step` in `trial_dir`."""
    log = MetricsLog(trial_dir)
    deadline = time.monotonic() + 240
    while not (log.root.exists() and step in log.steps()):
        assert process.poll() is None, f"harness run exited early with {process.returncode}"
        assert time.monotonic() < deadline, f"the trial did not reach step {step}"
        time.sleep(0.2)


def test_ctrl_c_tears_down_a_local_ray_instance(tmp_path: Path) -> None:
    """`harness run --executor ray` with no address starts its own Ray; SIGINT mid-trial stops
    the trial, its actors and components, its Redis and the whole Ray instance."""
    config = _write_config(tmp_path / "exp.yaml", [*BASE, *ONE_TRIAL])
    out = tmp_path / "exp"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    argv = [sys.executable, "-m", "harness.cli", "run", str(config), "--out", str(out)]
    argv += ["--steps", "40", "--executor", "ray"]
    process = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    trial_dir = out / "trials" / "gspo__seed0__lag0__fixed"
    _wait_for_step(process, trial_dir, 1)
    tree = _descendants(process.pid)
    seen = _cmdlines(tree)
    for expected in ("raylet", "gcs_server", "redis-server", "harness.cli learner"):
        assert expected in seen, f"{expected} not among the launch's processes:\n{seen}"
    assert "harness.cli generator" in seen
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 128 + signal.SIGINT
    _assert_all_gone(tree)
    record = read_trial_record(trial_dir)  # as a local interrupted trial: the next launch resumes
    assert record.status == "failed" and record.failure_reason.startswith("interrupted")


def test_a_sigkilled_run_with_its_own_ray_records_the_trial_and_resumes_from_the_bucket(
    tmp_path: Path, s3_server: S3Server
) -> None:
    """`harness run` with a private Ray instance and a bucket, SIGKILLed mid-trial: Ray's
    instance dies with it, the trial runner still records `interrupted`, uploads its Redis data
    and exits within seconds (not after Ray's one-minute GCS timeout), and nothing survives. A
    launch on another machine (an empty scratch dir) resumes from the bucket alone."""
    uri = s3_server.new_bucket()
    config = _write_config(tmp_path / "exp.yaml", [*BASE, *ONE_TRIAL])
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    argv = [sys.executable, "-m", "harness.cli", "run", str(config), "--out", uri, "--steps", "8"]
    argv += ["--executor", "ray", "executor.sync_interval_s=0.5"]
    first = subprocess.Popen(
        [*argv, f"executor.scratch_dir={tmp_path / 'a'}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    trial_dir = Storage(uri, tmp_path / "a").driver_dir() / "trials/gspo__seed0__lag0__fixed"
    _wait_for_step(first, trial_dir, 2)
    tree = _descendants(first.pid)
    ours = [p for p in tree if not _is_ray(p)]  # trial runner, components, Redis
    assert "harness.cli trial" in _cmdlines(ours)
    first.kill()
    first.wait()
    # Ray's own orphans (its dashboard and runtime-env agents) outlive the killed instance by
    # about a minute: watched from now, while the resume below runs, not waited out before it.
    check_ray_gone = _all_gone_within(tree, timeout_s=90)
    _assert_all_gone(ours, timeout_s=40)
    record = read_trial_record(trial_dir)
    assert record.status == "failed" and record.failure_reason.startswith("interrupted")
    # The runner saw the GCS refuse connections and left at once, instead of giving Ray's
    # teardown its 15 s (TEARDOWN_S) against a GCS that is gone.
    assert "Ray's GCS refuses connections" in TrialPaths(trial_dir).trial_log.read_text()
    bucket = RemoteTree.open(uri).child(f"trials/{trial_dir.name}")
    assert any(rel.startswith("redis/appendonlydir/") for rel in bucket.listing("redis"))

    again = subprocess.run(
        [*argv, f"executor.scratch_dir={tmp_path / 'b'}"],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    resumed = Storage(uri, tmp_path / "b").driver_dir() / "trials" / trial_dir.name
    record = read_trial_record(resumed)
    assert record.status == "completed" and record.resumed and record.steps_completed == 8
    ledger = sorted(TrialPaths(resumed).trained_groups.glob("step-*.json"))
    groups = [g["group_id"] for path in ledger for g in json.loads(path.read_text())]
    assert len(groups) == len(set(groups)) == 8 * 4
    check_ray_gone()


def _all_gone_within(procs: list[psutil.Process], timeout_s: float) -> Callable[[], None]:
    """`_assert_all_gone(procs, timeout_s)` on a thread from now; the returned check waits for
    it and raises what it found."""
    failures: list[AssertionError] = []

    def watch() -> None:
        try:
            _assert_all_gone(procs, timeout_s)
        except AssertionError as exc:
            failures.append(exc)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def check() -> None:
        watcher.join()
        if failures:
            raise failures[0]

    return check


def _bucket_executor(cluster: Cluster, scratch: Path, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "ray",
        "address": cluster.address,
        "scratch_dir": str(scratch),
        "sync_interval_s": 0.5,
        **extra,
    }


def test_ray_with_a_bucket_keeps_each_component_in_its_own_working_copy(
    tmp_path: Path, cluster: Cluster, s3_uri: str
) -> None:
    """Output in a bucket: learner (head) and generator (worker) each work in a private copy,
    nothing passes through the driver's disk but what the driver owns, and the metrics equal
    a local run's. The generator loads every version it uses from the bucket. The learner is 2
    FSDP ranks under torchrun in its bundle (locally too): its sharded checkpoint reaches the
    bucket, one shard file per rank."""
    fsdp = [*BASE, *ONE_TRIAL, "learner.parallel=fsdp"]
    local = _write_config(tmp_path / "local.yaml", [*fsdp, "executor.learner_ranks=2"])
    scratch = tmp_path / "scratch"
    on_ray = _write_config(
        tmp_path / "ray.yaml",
        fsdp,
        executor=_bucket_executor(
            cluster,
            scratch,
            learner_ranks=2,
            learner={"cpus": 0.5, "resources": {"node_head": 0.01}},
            generator={"cpus": 0.5, "resources": {"node_worker": 0.01}},
        ),
    )
    first = _run(local, tmp_path / "local", STEPS)
    second = _run(on_ray, s3_uri, STEPS)
    assert first.exit_code == 0 and second.exit_code == 0
    name = first.trials[0].spec.trial_name
    driver_copy = second.out_dir / "trials" / name
    assert_same_metrics(tmp_path / "local/trials" / name, driver_copy)
    assert not (driver_copy / "checkpoints").exists() and not (driver_copy / "weights").exists()
    assert (driver_copy / "logs/generator-0.log").is_file()  # pulled at the end

    head, worker = cluster.head_node.node_id, next(iter(cluster.worker_nodes)).node_id
    copies = driver_copy.parents[2] / "components" / name
    assert sorted(p.name for p in copies.iterdir()) == [
        f"generator-0@{worker[:12]}",
        f"learner@{head[:12]}",
    ]
    learner_copy, generator_copy = (
        copies / f"learner@{head[:12]}",
        copies / f"generator-0@{worker[:12]}",
    )
    assert (learner_copy / "checkpoints/latest.json").is_file()
    assert not (generator_copy / "metrics.parquet").exists()
    fetched = sorted(p.name for p in (generator_copy / "weights").iterdir())
    # Lag 0: the last batch used v(n-1); the generator then ran the evals of the last version,
    # v(n), which it fetched from the bucket too.
    assert fetched[-2:] == [f"v{STEPS - 1:06d}", f"v{STEPS:06d}"]

    bucket = RemoteTree.open(s3_uri).child(f"trials/{name}")
    files = bucket.listing()
    assert f"weights/v{STEPS:06d}/_COMPLETE" in files
    assert "checkpoints/latest.json" in files and "logs/generator-0.log" in files
    shards = f"checkpoints/step-{STEPS:06d}/shards/"
    assert {f"{shards}.metadata", f"{shards}__0_0.distcp", f"{shards}__1_0.distcp"} <= set(files)


def _kill_node(cluster: Cluster, node: Any) -> None:
    """What a machine dying does: SIGKILL its Ray services and everything below them (workers
    and the components they run) at once, then take the node out of the cluster's books."""
    doomed = []
    for infos in node.all_processes.values():
        for info in infos:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(info.process.pid)
                doomed += [*proc.children(recursive=True), proc]
    for proc in doomed:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    cluster.remove_node(node, allow_graceful=False)


def _worker(cluster: Cluster) -> Any:
    """The worker node, started again if an earlier test killed it."""
    if not cluster.worker_nodes:
        cluster.add_node(num_cpus=2, resources={"node_worker": 1})
        cluster.wait_for_nodes()
    return next(iter(cluster.worker_nodes))


@pytest.mark.parametrize("storage", ["shared path", "bucket"])
def test_losing_a_node_retries_the_trial_which_resumes(
    tmp_path: Path, cluster: Cluster, storage: str, request: pytest.FixtureRequest
) -> None:
    """Learner on the worker node (SPREAD, generator pinned to the head); the worker dies after
    step 3: the trial fails with `node lost`, the executor starts it again on the head alone,
    and it resumes from its last checkpoint; every group is trained exactly once. With a
    bucket the retried learner starts from an empty working copy: what it resumes from came
    through the bucket."""
    steps = 12  # the kill lands after step 3, well before the end
    scratch = tmp_path / "scratch"
    executor = (
        _bucket_executor(cluster, scratch)
        if storage == "bucket"
        else {
            "kind": "ray",
            "address": cluster.address,
        }
    )
    executor |= {
        "placement_strategy": "SPREAD",
        "learner": {"cpus": 1},
        "generator": {"cpus": 1, "resources": {"node_head": 0.01}},
        "max_trial_retries": 1,
    }
    config = _write_config(tmp_path / "exp.yaml", [*BASE, *ONE_TRIAL], executor=executor)
    worker = _worker(cluster)
    head = cluster.head_node
    out: Path | str = tmp_path / "exp"
    trial_dir = tmp_path / "exp/trials/gspo__seed0__lag0__fixed"
    # where the learner on node N keeps its files: the trial dir, or its own working copy
    learner_dir = {worker.node_id: trial_dir, head.node_id: trial_dir}
    if storage == "bucket":
        out = request.getfixturevalue("s3_uri")
        trial_dir = Storage(out, scratch).driver_dir() / "trials/gspo__seed0__lag0__fixed"
        copies = trial_dir.parents[2] / "components" / trial_dir.name
        learner_dir = {n: copies / f"learner@{n[:12]}" for n in (worker.node_id, head.node_id)}
    killed_at: list[float] = []
    placed_before: list[dict[str, list[str]]] = []
    learner_pid: list[int] = []

    def kill_worker_after_step_3() -> None:
        log = MetricsLog(trial_dir)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if log.root.exists() and 3 in log.steps():
                placed_before.append(_placements(trial_dir))
                pid_file = learner_dir[worker.node_id] / "logs/learner.pid"
                learner_pid.append(int(pid_file.read_text()))
                killed_at.append(time.time())
                _kill_node(cluster, worker)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_worker_after_step_3, daemon=True)
    killer.start()
    result = _run(config, out, steps)
    killer.join(timeout=5)
    assert killed_at, "the worker node was never killed"
    assert placed_before[0]["learner"] == [worker.node_id]  # SPREAD put it on the worker
    assert not process_alive(learner_pid[0])  # the learner died with its node
    assert [t.status for t in result.trials] == ["completed"]
    record = read_trial_record(trial_dir)
    assert record.resumed and record.steps_completed == steps
    trial_log = TrialPaths(trial_dir).trial_log.read_text()
    assert "learner failed: node lost" in trial_log
    assert "a Ray node was lost; retry 1 of 1, resuming" in trial_log
    assert _placements(trial_dir)["learner"] == [worker.node_id, head.node_id]
    ledger = sorted(TrialPaths(trial_dir).trained_groups.glob("step-*.json"))
    groups = [g["group_id"] for path in ledger for g in json.loads(path.read_text())]
    assert len(groups) == len(set(groups)) == steps * 4  # learner.prompts_per_step=4
    # Resumed from a checkpoint: the first attempt's ledger up to its last checkpoint (step 2,
    # or 4 if it got there before dying) was kept, every later step retrained by the retry
    # (whose learner.pid is newer than the kill). The retry's own copy of the ledger tells.
    retry_dir = learner_dir[head.node_id]
    retried_at = (retry_dir / "logs/learner.pid").stat().st_mtime
    assert retried_at > killed_at[0]
    retry_ledger = sorted(TrialPaths(retry_dir).trained_groups.glob("step-*.json"))
    kept = [p.name for p in retry_ledger if p.stat().st_mtime < retried_at]
    assert kept in ([f"step-{k:06d}.json" for k in range(1, last + 1)] for last in (2, 4))
    if storage == "bucket":
        bucket = RemoteTree.open(str(out)).child(f"trials/{trial_dir.name}")
        assert len(bucket.listing("trained_groups")) == steps
