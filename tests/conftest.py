"""Shared fixtures: a real redis-server on a free loopback port, with a password, per test;
every test leaves the process-wide objective registries, and torch's global state, as it found
them.

Float tolerances must hold on any CPU and thread count (tests/learner/float_bounds.py). To run a
test file under a given setting:

- intra-op threads: `TESTS_TORCH_THREADS=1 pytest ...` sets torch's intra-op thread count once,
  when this conftest is imported (before any test), and every test starts from it (the
  `_torch_state_as_found` fixture puts it back after a test that changed it). Unset, an xdist
  worker takes its share of the CPUs (1 each for README (b) on 2 cores) and a plain run keeps
  torch's default (OMP_NUM_THREADS, else one per core);
- instruction set: `ATEN_CPU_CAPABILITY=avx2 pytest ...` (or `default`, `avx512`), read by torch
  at import: the vectorised kernels of that ISA (reductions and GEMMs sum in another order).

Property tests (hypothesis) run derandomized: the examples are a function of the test, so a
failure reproduces on every run and machine; `HYPOTHESIS_PROFILE=random` draws fresh examples to
explore.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import torch
from hypothesis import settings as hypothesis_settings

from harness.launch.forked_child import ZYGOTE_ENV, zygote_from_env
from harness.launch.warm_slots import WarmProcess
from tests.learner.registries import restored_registries
from tests.s3 import S3Server, start_s3_server
from tests.timing_log import longest_first

hypothesis_settings.register_profile("derandomized", derandomize=True, database=None)
hypothesis_settings.register_profile("random", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "derandomized"))


def _suite_threads() -> int | None:
    """Intra-op threads for this test process: TESTS_TORCH_THREADS when set; under pytest-xdist
    the worker's share of this process's CPUs (README (b): 2 workers on 2 cores, 1 thread
    each, so in-process tests do not oversubscribe the cores); else None (torch's default)."""
    if threads := os.environ.get("TESTS_TORCH_THREADS"):
        return int(threads)
    if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
        return max(1, len(os.sched_getaffinity(0)) // workers)
    return None


if (suite_threads := _suite_threads()) is not None:
    # torch._C's: an in-process vLLM CPU engine makes torch.set_num_threads a no-op.
    torch._C.set_num_threads(suite_threads)


# Each module's seconds in recent full runs (`python -m tests.timing_log LOG... --write` this
# file): the suite hands the longest modules to the workers first.
MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist's loadscope hands out modules by their number of tests, most first, unless
    told to keep the collection's order: kept, so the order below decides."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


PREBUILD: pytest.StashKey[tuple[subprocess.Popen, Path]] = pytest.StashKey()


def pytest_sessionstart(session: pytest.Session) -> None:
    """A full parallel run (README (b)) starts tests.prebuild_models beside its workers, niced:
    the shared built-in models are built in the cores' idle time (the Ray tests' waits) instead
    of inside the first test needing each. `TESTS_PREBUILD_MODELS=0` turns it off."""
    config = session.config
    if not _prebuild_wanted(config):
        return
    fd, name = tempfile.mkstemp(prefix="prebuild-models-", suffix=".log")
    log = Path(name)
    with os.fdopen(fd, "w") as handle:
        builder = subprocess.Popen(
            ["nice", "-n", "10", sys.executable, "-m", "tests.prebuild_models"],
            cwd=Path(__file__).resolve().parents[1],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    config.stash[PREBUILD] = (builder, log)


def _prebuild_wanted(config: pytest.Config) -> bool:
    """The controller of a run with xdist workers over the whole suite (no paths, -k or -m):
    a run of a few modules may need none of the models."""
    return (
        not os.environ.get("PYTEST_XDIST_WORKER")
        and os.environ.get("TESTS_PREBUILD_MODELS", "1") != "0"
        and bool(config.getoption("numprocesses", default=None))
        and config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and not config.option.keyword
        and not config.option.markexpr
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say so when the prebuild failed: the tests then built what they needed themselves."""
    if PREBUILD not in terminalreporter.config.stash:
        return
    builder, log = terminalreporter.config.stash[PREBUILD]
    if builder.poll() not in (None, 0):
        terminalreporter.write_line(f"tests.prebuild_models exited {builder.returncode}: see {log}")


def pytest_unconfigure(config: pytest.Config) -> None:
    """A suite that ended before the builds did stops them (the builder removes its staging
    directory on SIGTERM)."""
    if PREBUILD not in config.stash:
        return
    builder, _ = config.stash[PREBUILD]
    if builder.poll() is None:
        builder.terminate()
    try:
        builder.wait(timeout=30)
    except subprocess.TimeoutExpired:
        builder.kill()
        builder.wait()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules longest first (tests.timing_log.longest_first over MODULE_SECONDS); tests within
    a module keep their file order. test_ray_executor, the longest, mostly waits on Ray (131
    CPU-s in 256 s alone): begun first, it overlaps the CPU-bound modules instead of trailing
    them."""
    known = json.loads(MODULE_SECONDS.read_text()) if MODULE_SECONDS.exists() else {}
    order = longest_first([_module(item) for item in items], known)
    rank = {module: index for index, module in enumerate(order)}
    items.sort(key=lambda item: rank[_module(item)])


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """`TESTS_TIMING_LOG=FILE`: one JSON line per test phase (node id, seconds, when it ended),
    written by the controller alone; `python -m tests.timing_log FILE` sums it up."""
    log = os.environ.get("TESTS_TIMING_LOG")
    if not log or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    node = getattr(report, "node", None)
    worker = node.gateway.id if node is not None else "main"
    entry = {"id": report.nodeid, "when": report.when, "d": report.duration, "w": worker}
    with open(log, "a") as handle:
        handle.write(json.dumps(entry | {"t": time.time()}) + "\n")


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


@pytest.fixture(autouse=True)
def _torch_state_as_found() -> Iterator[None]:
    """Each test leaves torch's process-wide settings as it found them: intra-op threads (the
    learner's `configure_determinism` and several rank tests pin one), deterministic algorithms
    (and warn-only), the default dtype and grad mode. Otherwise a float comparison's outcome
    depends on which test ran before it. Interop threads can be set only once: left alone."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    dtype = torch.get_default_dtype()
    grad = torch.is_grad_enabled()
    yield
    if torch.get_num_threads() != threads:
        torch._C.set_num_threads(threads)
    if (
        torch.are_deterministic_algorithms_enabled() != deterministic
        or torch.is_deterministic_algorithms_warn_only_enabled() != warn_only
    ):
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    if torch.get_default_dtype() != dtype:
        torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)


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


@pytest.fixture(scope="session", autouse=True)
def component_zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmProcess | None]:
    """One zygote per test process (xdist worker), named in this process's environment, so
    every trial a test starts (a supervisor in this process or one it spawns) forks its cold
    components from it, as `harness run` forks its trials' (harness.cli_zygote): ~5 CPU-s of
    imports paid once per worker instead of once per component start. Tests that pin a cold
    start remove it from the environment. `TESTS_ZYGOTE=0` starts none (every component cold:
    to compare, or to debug a cold start)."""
    if zygote_from_env() is not None or os.environ.get("TESTS_ZYGOTE") == "0":
        yield None  # a zygote given from outside (used), or none wanted
        return
    # Unix socket paths are limited to 107 bytes: a short private directory, not the basetemp.
    socket_dir = Path(tempfile.mkdtemp(prefix="harness-zygote-"))
    log_path = tmp_path_factory.mktemp("zygote") / "zygote.log"
    zygote = WarmProcess.spawn_zygote(socket_dir / "zygote.sock", log_path, dict(os.environ))
    os.environ.update(zygote.zygote_env)
    try:
        yield zygote
    finally:
        os.environ.pop(ZYGOTE_ENV, None)
        zygote.kill()
        shutil.rmtree(socket_dir, ignore_errors=True)


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
