"""The `ray` executor: the trial pool, connected to a cluster, retrying trials that lost a node.

Each trial is still a `harness trial` subprocess of the driver (SubprocessTrialPool: its own
session, the same teardown on Ctrl-C, SIGTERM, errors and timeouts), so resume, progress display,
MLflow and report are the local ones. What changes is inside the trial: with `executor.kind=ray` its
supervisor joins the cluster ($RAY_ADDRESS, set here) and runs its learner and generators as
actors in a placement group (`ray_components`); its Redis binds the node's address.

With no address (`executor.address`, $RAY_ADDRESS) the pool starts a private local Ray instance
(no dashboard, no usage stats, a fresh temp dir) and stops it when it closes, so every raylet,
GCS and worker goes with it. A trial that failed because a node died (its failure reason says
`node lost`) is started again with --resume, at most `executor.max_trial_retries` times: the
placement group is re-created on whatever nodes remain, and the trial resumes from its last
checkpoint like a killed local trial.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.record import TrialRecordError, read_trial_record
from contract.trial import LaunchStatus
from harness.config.executor import ExecutorConfig
from harness.executors.base import NODE_LOST
from harness.executors.gcs_address import host_and_port
from harness.launch.pool import SubprocessTrialPool
from harness.launch.processes import open_private
from harness.launch.trials import CommandBuilder, PoolLimits, TrialExit
from harness.launch.warm_slots import WarmSlots
from harness.overrides import ConfigError
from harness.signals import SignalLatch

if TYPE_CHECKING:  # importing ray_components imports Ray, an optional extra; see components()
    from harness.executors.ray_components import RayLauncher

# Ray's token authentication (on by default for new clusters since Ray 2.5x): the mode and where
# the token is; trials must join with the driver's.
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
LOCAL_OBJECT_STORE_BYTES = 200 * 1024 * 1024  # trials pass nothing through Ray's object store


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds on a GCS address nobody answers at; ray.init retries for minutes."""
    if (where := host_and_port(address)) is None:
        return
    try:
        socket.create_connection(where, timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {address} ({exc})") from None


def _address(executor: ExecutorConfig) -> str | None:
    """The cluster to join, or None to start a local instance."""
    return executor.address or os.environ.get("RAY_ADDRESS") or None


class RayTrialPool(SubprocessTrialPool):
    """A SubprocessTrialPool whose trials run their components on Ray; retries trials that lost
    a node."""

    def __init__(
        self, executor: ExecutorConfig, command: CommandBuilder, limits: PoolLimits
    ) -> None:
        super().__init__(command, limits)
        self.executor = executor
        self.retries: dict[str, int] = {}  # trial name -> retries spent
        self.address: str | None = None
        self._temp_dir: Path | None = None
        self._connected = False

    def __enter__(self) -> RayTrialPool:
        self.connect()
        return self

    def connect(self) -> None:
        """Join (or start) Ray, and hand the GCS address to every trial through $RAY_ADDRESS."""
        import ray  # an optional extra, imported only by a pool that uses it

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self.env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        address = _address(self.executor)
        try:
            self._init(ray, address)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            self._remove_temp_dir()
            where = f"the Ray cluster at {address}" if address else "a local Ray instance"
            raise ConfigError(f"executor.kind=ray: cannot join {where}: {exc}") from None
        self._connected = True
        self.address = ray.get_runtime_context().gcs_address
        self.env["RAY_ADDRESS"] = self.address
        for key in AUTH_ENV:  # a new local instance turns token auth on in this process only
            if key in os.environ:
                self.env[key] = os.environ[key]

    def _init(self, ray: Any, address: str | None) -> None:
        if address is None:
            # A short path: Ray's socket paths under it must stay within 107 bytes.
            base = os.environ.get("RAY_TMPDIR") or "/tmp"
            self._temp_dir = Path(tempfile.mkdtemp(prefix="harness-ray-", dir=base))
            ray.init(
                address="local",
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                log_to_driver=False,
                _temp_dir=str(self._temp_dir),
            )
        else:
            _probe(address)
            ray.init(address=address, log_to_driver=False)

    def close(self) -> list[TrialExit]:
        """Stop every trial (SubprocessTrialPool.close), then leave Ray; a local instance stops
        with it."""
        try:
            return super().close()
        finally:
            self._disconnect()

    def _disconnect(self) -> None:
        if not self._connected:
            return
        import ray  # an optional extra, imported only by a pool that uses it

        ray.shutdown()
        self._connected = False
        self._remove_temp_dir()

    def _remove_temp_dir(self) -> None:
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def reap(self) -> list[TrialExit]:
        """SubprocessTrialPool.reap, except that a trial that lost a node is started again
        (resuming)."""
        exits = []
        for done in super().reap():
            if self._should_retry(done):
                self._retry(done)
            else:
                exits.append(done)
        return exits

    def _should_retry(self, done: TrialExit) -> bool:
        if done.status != LaunchStatus.FAILED or self.interrupted is not None:
            return False
        if self.retries.get(done.spec.trial_name, 0) >= self.executor.max_trial_retries:
            return False
        try:
            record = read_trial_record(done.spec.trial_dir)
        except TrialRecordError:
            return False
        return record is not None and NODE_LOST in (record.failure_reason or "")

    def _retry(self, done: TrialExit) -> None:
        name = done.spec.trial_name
        self.retries[name] = self.retries.get(name, 0) + 1
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        line = (
            f"\n=== harness {stamp}: {done.message}: a Ray node was lost; retry "
            f"{self.retries[name]} of {self.executor.max_trial_retries}, resuming\n"
        )
        with open_private(done.spec.paths.trial_log) as log:
            log.write(line.encode())
        self.start(done.spec, resume=True)


class RayExecutor:
    """Trials as subprocesses of the driver (a `RayTrialPool`), components as Ray actors."""

    # Private even on one machine, so nothing can lean on a shared path (trial_storage).
    private_components = True

    def __init__(self, executor: ExecutorConfig) -> None:
        self.executor = executor

    def trial_pool(
        self, command: CommandBuilder, limits: PoolLimits, warm: WarmSlots | None = None
    ) -> RayTrialPool:
        if warm is not None:  # warm_plan gives none for kind=ray
            raise ValueError("the ray executor keeps no warm component processes")
        return RayTrialPool(self.executor, command, limits)

    @contextlib.contextmanager
    def components(self, num_generators: int, interrupted: SignalLatch) -> Iterator[RayLauncher]:
        # Imported here: ray_components imports Ray (an optional extra) at its top.
        from harness.executors.ray_components import RayLauncher

        with RayLauncher(self.executor, num_generators, interrupted) as launcher:
            yield launcher

    def abandoned(self) -> bool:
        # Imported here: ray_components imports Ray (an optional extra) at its top.
        from harness.executors.ray_components import ray_abandoned

        return ray_abandoned()
