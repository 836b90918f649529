"""An embedded redis-server for local runs: loopback only, random password, AOF as configured.

The password is handed to redis-server on stdin (`redis-server -`), never on the command line, so
other local users cannot read it from the process list. The server never outlives us: it is
stopped on context exit and at interpreter exit (atexit), and on Linux the kernel sends it SIGTERM
when the process that started it dies (PR_SET_PDEATHSIG), which covers SIGKILL of the parent.

The data directory holds every rollout of the run (AOF) and the log: it is made 0700, and the
server runs under umask 077 (Redis has no option for the mode of the files it creates), so its
AOF files and log are 0600; files an older server left more open are tightened at start.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from buffer.config import AppendFsync

_PR_SET_PDEATHSIG = 1
_PRIVATE_UMASK = 0o077  # files 0600, directories 0700


def _prepare_child() -> None:
    """Runs in the child between fork and exec: private file modes, and ask the kernel for
    SIGTERM when the parent dies."""
    os.umask(_PRIVATE_UMASK)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def make_private(directory: Path) -> None:
    """chmod `directory` and every directory below it 0700, every file 0600."""
    directory.chmod(0o700)
    for path in directory.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o700 if path.is_dir() else 0o600)


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class RedisStartError(RuntimeError):
    """redis-server would not start (an AOF it cannot load, a port it cannot bind): one line."""


class EmbeddedRedis:
    """A private redis-server on 127.0.0.1; use as a context manager, connect with `.url`.

    `host`: the address to bind instead of loopback, for components on other machines (the Ray
    executor binds the node's routable IP); the random password guards it either way.
    """

    def __init__(
        self,
        data_dir: Path | str,
        appendfsync: AppendFsync = "everysec",
        *,
        start_timeout_s: float = 10.0,
        host: str = "127.0.0.1",
    ):
        if appendfsync not in ("always", "everysec", "off"):
            raise ValueError(f"appendfsync={appendfsync!r}: use 'always', 'everysec' or 'off'")
        self.data_dir = Path(data_dir)
        self.host = host
        self.appendfsync = appendfsync
        self.password = secrets.token_hex(24)
        self.port: int | None = None
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._log_start = 0  # where the running server's lines begin in its (appended) log

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("EmbeddedRedis has not been started; use `with EmbeddedRedis(...)`")
        return f"redis://:{self.password}@{self.host}:{self.port}/0"

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The redis-server process (None when stopped)."""
        return self._process

    @property
    def log_file(self) -> Path:
        return self.data_dir / "redis.log"

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start (on the previous port after a stop, else on a free one) and wait for PING."""
        if self._process is not None and self._process.poll() is None:
            return
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError(
                "redis-server is not on PATH; install Debian's redis-server "
                "(apt-get install redis-server) or set buffer.redis_url to a running Redis"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        make_private(self.data_dir)
        fixed_port = self.port is not None
        for _attempt in range(3):  # a free port can be taken between probing and binding
            self.port = self.port if fixed_port else _free_port(self.host)
            self._log_start = self._log_size()
            self._process = self._spawn(binary)
            if self._wait_until_ready():
                atexit.register(self.stop)
                return
            exited = self._process.poll() is not None
            self._reap()
            why = self._log_warning(self._log_start)
            if exited and "Address already in use" not in why:
                raise RedisStartError(self._start_failure(why))  # another port would not help
            if fixed_port:
                break
        raise RedisStartError(
            f"redis-server did not answer on {self.host}:{self.port} within "
            f"{self._start_timeout_s} s; see its log {self.log_file}"
        )

    def exit_reason(self) -> str | None:
        """None while the server runs (or was never started); once it exited on its own (a
        crash, a kill, an AOF it could not write), one line saying how and what its log said."""
        process = self._process
        if process is None or process.poll() is None:
            return None
        code = process.returncode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        said = self._log_warning(self._log_start, running=True, last=2)
        return f"redis-server (pid {process.pid}) {how}" + (f": {said}" if said else "")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SHUTDOWN (which fsyncs the AOF), then SIGTERM, then SIGKILL; idempotent."""
        atexit.unregister(self.stop)
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(redis.RedisError):  # not answering: signals below
                self._client().shutdown()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):  # else _reap kills it
                    process.wait(timeout=timeout_s)
        self._reap()

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (tests of AOF durability use it)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def restart(self) -> None:
        """Stop if running, then start on the same port, password and data dir (reloads the AOF)."""
        self.stop()
        self.start()

    def _config(self) -> str:
        lines = [
            f"bind {self.host}",
            "protected-mode yes",
            f"port {self.port}",
            f"requirepass {self.password}",
            f'dir "{self.data_dir.resolve()}"',
            f'logfile "{self.log_file.resolve()}"',
            'save ""',
            "daemonize no",
            "loglevel notice",
        ]
        if self.appendfsync == "off":
            lines.append("appendonly no")
        else:
            lines += ["appendonly yes", f"appendfsync {self.appendfsync}"]
        return "\n".join(lines) + "\n"

    def _spawn(self, binary: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [binary, "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_prepare_child,  # noqa: PLW1509 - no threads run between fork and exec
            start_new_session=True,  # a Ctrl-C to our terminal must not kill Redis before us
        )
        assert process.stdin is not None
        process.stdin.write(self._config().encode())
        process.stdin.close()
        return process

    def _client(self) -> redis.Redis:
        # No retries: after SHUTDOWN the connection drops by design, and a retrying client would
        # spend seconds reconnecting to a server that is gone.
        return redis.Redis(
            host=self.host,
            port=self.port,
            password=self.password,
            socket_timeout=5,
            retry=Retry(NoBackoff(), 0),
        )

    def _wait_until_ready(self) -> bool:
        deadline = time.monotonic() + self._start_timeout_s
        assert self._process is not None
        while time.monotonic() < deadline and self._process.poll() is None:
            try:
                with self._client() as client:
                    if client.ping():
                        return True
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.02)
        return False

    def _reap(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()

    def _log_size(self) -> int:
        try:
            return self.log_file.stat().st_size
        except OSError:
            return 0

    def _log_warning(self, start: int, *, running: bool = False, last: int = 1) -> str:
        """The last `last` warning (`#`) lines the server logged after byte `start`, without
        their pid/time prefix, joined into one line; '' if none. Redis logs why it refused to
        start, or stopped, this way. `running`: only those after it was ready (its start-up
        always warns about memory overcommit)."""
        try:
            with self.log_file.open("rb") as log:
                log.seek(start)
                lines = log.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        if running:
            ready = [i for i, line in enumerate(lines) if "Ready to accept connections" in line]
            lines = lines[ready[-1] + 1 :] if ready else []
        warnings = [" ".join(line.split(" # ", 1)[1].split()) for line in lines if " # " in line]
        return " / ".join(warnings[-last:])

    def _start_failure(self, why: str) -> str:
        """One line for a server that exited while starting; an AOF it cannot load says how to
        repair it."""
        what = f"redis-server exited while starting in {self.data_dir}: {why or 'no reason logged'}"
        if "append only file" not in why and "AOF" not in why:
            return f"{what} (its log: {self.log_file})"
        manifest = next(self.data_dir.glob("appendonlydir/*.manifest"), None)
        repair = f"redis-check-aof --fix {manifest}" if manifest else "redis-check-aof --fix"
        return (
            f"{what}. The run's AOF is damaged: back up {self.data_dir}, then either repair it "
            f"with `{repair}` (it drops everything after the damage) and resume with --resume, "
            "or rerun the trial without --resume"
        )
