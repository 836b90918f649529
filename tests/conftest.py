"""Shared fixtures: a real redis-server on a free loopback port, with a password, per test;
every test leaves the process-wide objective registries as it found them."""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.learner.registries import restored_registries
from tests.s3 import S3Server, start_s3_server


@dataclass(frozen=True)
class RedisInstance:
    """Connection facts of a test redis-server; `url` carries the password."""

    host: str
    port: int
    password: str
    data_dir: Path
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.host}:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, password=self.password)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_test_redis(data_dir: Path, appendfsync: str | None = None) -> RedisInstance:
    """Start redis-server on 127.0.0.1 with a random password; wait until it answers PING."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is missing; scripts/setup.sh installs Debian's redis-server")
    port = _free_port()
    password = secrets.token_hex(16)
    args = [
        binary,
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--requirepass",
        password,
        "--dir",
        str(data_dir),
        "--save",
        "",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
    ]
    if appendfsync is not None:
        args += ["--appendonly", "yes", "--appendfsync", appendfsync]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    instance = RedisInstance("127.0.0.1", port, password, data_dir, process)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        try:
            if instance.client().ping():
                return instance
        except redis.exceptions.ConnectionError:
            time.sleep(0.02)
    process.kill()
    pytest.fail(f"redis-server on port {port} did not answer within 10 s")


def stop_test_redis(instance: RedisInstance) -> None:
    instance.process.terminate()
    try:
        instance.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        instance.process.kill()
        instance.process.wait()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisInstance]:
    """A fresh, password-protected redis-server for one test, stopped afterwards."""
    data_dir = tmp_path / "redis"
    data_dir.mkdir()
    instance = start_test_redis(data_dir)
    yield instance
    stop_test_redis(instance)


@pytest.fixture(autouse=True)
def _objective_registries_as_found() -> Iterator[None]:
    """Loading a plugin (a test's, or a shipped config's such as objective_zoo.yaml) registers
    its arm and loss process-wide; test_arms pins the registries' exact contents, so no test
    may leave one behind for whichever test its worker runs next."""
    with restored_registries():
        yield


# MLflow 3 opens `sqlite:///<cwd>/mlflow.db` (artifacts in `<cwd>/mlruns`) whenever a client gets
# no tracking URI; run from the repository root, that leaves a store there (one got committed).
STRAY_MLFLOW = ("mlflow.db", "mlruns", "mlartifacts")


@pytest.fixture(scope="session", autouse=True)
def _no_mlflow_store_in_the_repository() -> Iterator[None]:
    """Fail the session if a test left an MLflow store in the repository root (use tmp dirs)."""
    repo = Path(__file__).resolve().parents[1]
    before = {name for name in STRAY_MLFLOW if (repo / name).exists()}
    yield
    created = [name for name in STRAY_MLFLOW if (repo / name).exists() and name not in before]
    assert not created, (
        f"tests created {created} in {repo}: give every MlflowClient / harness run an explicit "
        "tracking URI or output dir under tmp_path"
    )


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One moto S3 server for the session; tests isolate themselves with `s3_uri` buckets."""
    server = start_s3_server(tmp_path_factory.mktemp("s3") / "moto.log")
    try:
        yield server
    finally:
        server.process.terminate()
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.process.kill()


@pytest.fixture
def s3_uri(s3_server: S3Server) -> str:
    """`s3://.../exp?endpoint_override=...` in a fresh bucket of its own."""
    return s3_server.new_bucket()
