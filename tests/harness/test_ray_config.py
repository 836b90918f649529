"""The executor section and its plumbing (no Ray cluster needed; test_ray_executor.py has one)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import executor_overrides
from harness.config import ConfigError, load_config
from harness.config.executor import ComponentResources
from harness.executors import open_executor
from harness.executors.gcs_address import host_and_port
from harness.executors.ray import RayTrialPool
from harness.executors.ray_components import RayLauncher, bundle_index
from harness.launch.pool import SubprocessTrialPool
from harness.launch.trials import PoolLimits
from harness.signals import SignalLatch

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs/quickstart.yaml"


def test_local_is_the_default_and_picks_the_plain_pool() -> None:
    cfg = load_config(QUICKSTART)
    assert cfg.executor.kind == "local"
    pool = open_executor(cfg.executor).trial_pool(lambda spec, resume: ["true"], PoolLimits(1))
    assert type(pool) is SubprocessTrialPool


def test_ray_picks_the_retrying_pool_with_the_configured_budget() -> None:
    cfg = load_config(QUICKSTART, ["executor.kind=ray", "executor.max_trial_retries=5"])
    pool = open_executor(cfg.executor).trial_pool(lambda spec, resume: ["true"], PoolLimits(2))
    assert isinstance(pool, RayTrialPool) and pool.executor.max_trial_retries == 5


def test_the_executor_is_not_part_of_the_config_hash() -> None:
    """A trial started locally may be resumed on Ray (and back): same identity, same run id."""
    plain = load_config(QUICKSTART)
    on_ray = load_config(QUICKSTART, ["executor.kind=ray", "executor.placement_strategy=SPREAD"])
    assert plain.config_hash() == on_ray.config_hash()
    assert plain.config_hash() != load_config(QUICKSTART, ["learner.lr=0.5"]).config_hash()


def test_ray_client_addresses_are_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"executor\.address.*ray job submit"):
        load_config(QUICKSTART, ["executor.kind=ray", "executor.address=ray://head:10001"])


def test_unknown_strategy_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"executor\.placement_strategy"):
        load_config(QUICKSTART, ["executor.placement_strategy=RANDOM"])


def test_bundles_leave_out_zero_amounts_and_keep_custom_resources() -> None:
    assert ComponentResources().bundle() == {"CPU": 1.0}
    pinned = ComponentResources(cpus=0.5, gpus=1, resources={"node_a": 0.01})
    assert pinned.bundle() == {"CPU": 0.5, "GPU": 1.0, "node_a": 0.01}
    assert ComponentResources(cpus=0, gpus=1).bundle() == {"GPU": 1.0}


def test_an_empty_bundle_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"executor\.generator.*cpus > 0"):
        load_config(QUICKSTART, ["executor.generator.cpus=0"])


def test_bundle_order_is_learner_then_each_generator() -> None:
    cfg = load_config(QUICKSTART, ["executor.learner.gpus=1", "executor.generator.cpus=2"])
    launcher = RayLauncher(cfg.executor, num_generators=2, interrupted=SignalLatch())
    assert launcher.bundles() == [{"CPU": 1.0, "GPU": 1.0}, {"CPU": 2.0}, {"CPU": 2.0}]
    assert [bundle_index(n) for n in ("learner", "generator-0", "generator-1")] == [0, 1, 2]
    with pytest.raises(ValueError, match="critic"):
        bundle_index("critic")


def test_cli_flags_become_overrides() -> None:
    assert executor_overrides(None, None) == []
    assert executor_overrides("ray", "10.0.0.1:6379") == [
        "executor.kind=ray",
        "executor.address=10.0.0.1:6379",
    ]
    cfg = load_config(QUICKSTART, executor_overrides("ray", "10.0.0.1:6379"))
    assert (cfg.executor.kind, cfg.executor.address) == ("ray", "10.0.0.1:6379")


def test_cli_rejects_an_unknown_executor_before_running_anything(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    argv = [sys.executable, "-m", "harness.cli", "run", str(QUICKSTART), "--out", str(out)]
    result = subprocess.run(
        [*argv, "--executor", "slurm"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 2
    assert "executor.kind" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_an_address_nobody_answers_at_fails_in_seconds() -> None:
    """ray.init would retry for minutes; the pool probes the GCS port first."""
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg = load_config(QUICKSTART, ["executor.kind=ray", f"executor.address=127.0.0.1:{port}"])
    pool = open_executor(cfg.executor).trial_pool(lambda spec, resume: ["true"], PoolLimits(1))
    started = time.monotonic()
    with pytest.raises(ConfigError, match=rf"cannot join the Ray cluster at 127.0.0.1:{port}"):
        pool.connect()
    assert time.monotonic() - started < 10


def test_gcs_addresses_parse_to_socket_addresses_and_ray_forms_are_left_to_ray() -> None:
    assert host_and_port("127.0.0.1:6379") == ("127.0.0.1", 6379)
    assert host_and_port("[::1]:6379") == ("::1", 6379)  # IPv6 in brackets
    assert host_and_port("head.example:6379") == ("head.example", 6379)
    for left_to_ray in ("auto", "ray://head:10001x", "head"):
        assert host_and_port(left_to_ray) is None
