"""The requesting side of a zygote (`harness.cli_zygote`): where one is, and asking it to fork
a component start (`warm_child.WarmChild` makes every start it can a fork) or a warm process
(`warm_slots.WarmProcess.fork`).

A forked process's pid is its own, in its own session, so a kill by pid or process group
reaches it as it would reach a cold one; the zygote reports its exit code (or killing signal)
over the connection the request came on, which the requester keeps open while it runs (closing
it kills the process).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from harness.launch.warm_protocol import (
    VANISHED_CODE,
    ExitReply,
    ProtocolError,
    connect,
    decode,
    encode,
    read_line,
)

# Set by whoever started a zygote (`harness run`, the test suite) in the supervisors'
# environment: JSON {"socket": path, "pid": pid}.
ZYGOTE_ENV = "HARNESS_ZYGOTE"
PID_REPLY_TIMEOUT_S = 10.0  # a fork takes milliseconds; this only bounds a stuck zygote
REAP_WAIT_S = 5.0  # the zygote reports an ended child within milliseconds; bounds a stuck one


def zygote_from_env(environ: Mapping[str, str] = os.environ) -> tuple[str, int] | None:
    """(socket path, pid) of the zygote this process's components may be forked by, or None
    (unset or unreadable: components start cold)."""
    text = environ.get(ZYGOTE_ENV)
    if not text:
        return None
    try:
        data = json.loads(text)
        return str(data["socket"]), int(data["pid"])
    except (ValueError, KeyError, TypeError):
        return None


def zygote_env(socket_path: Path, pid: int) -> dict[str, str]:
    return {ZYGOTE_ENV: json.dumps({"socket": str(socket_path), "pid": pid})}


def fork_request(
    *,
    name: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    log_path: Path | str,
    cpus: Iterable[int],
    **extra: object,
) -> dict[str, Any]:
    """A start as the zygote takes it, run as a cold start from here would run: in this
    process's working directory, output appended to `log_path`, on `cpus`; `extra` adds the
    fields only some starts have (`module`, `pinned`)."""
    return {
        "argv": list(argv),
        "env": dict(env),
        "cwd": os.getcwd(),
        "log": str(Path(log_path).resolve()),
        "cpus": sorted(cpus),
        "name": name,
        **extra,
    }


def request_fork(
    conn: socket.socket,
    assignment: dict[str, Any],
    fds: Sequence[int] = (),
    timeout_s: float = PID_REPLY_TIMEOUT_S,
) -> int | None:
    """Hand the zygote at the other end of `conn` one start (with `fds`, descriptors the forked
    process inherits, passed as SCM_RIGHTS); the forked pid, or None (then the connection is
    closed, which kills anything the zygote forked for it)."""
    try:
        conn.settimeout(timeout_s)
        if fds:
            socket.send_fds(conn, [encode(assignment)], list(fds))
        else:
            conn.sendall(encode(assignment))
        pid = decode(read_line(conn)).get("pid")
    except (OSError, ProtocolError):
        pid = None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        conn.close()
        return None
    return pid


class ForkedProcess:
    """A process the zygote forked for this one, with the part of `subprocess.Popen`'s interface
    a warm slot uses (`pid`, `poll`, `wait`, `kill`), so a slot keeps forked and spawned warm
    processes alike. It lives while the connection is open: closing it (this process dying
    included) makes the zygote SIGKILL it."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._conn = conn
        conn.setblocking(False)
        self._reply = ExitReply(conn)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._reply.poll()
            if self.returncode is None and not _running(self.pid):
                # It ended and the zygote's reply is on its way (it reaps on SIGCHLD): wait for
                # it, as Popen.poll would see the exit at once.
                deadline = time.monotonic() + REAP_WAIT_S
                while self.returncode is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                    self.returncode = self._reply.poll()
                if self.returncode is None:
                    self.returncode = VANISHED_CODE
            if self.returncode is not None:
                self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return code

    def send_signal(self, signum: int) -> None:
        """Signal its process group (it leads its own session, as a spawned one does), while
        it runs."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def close(self) -> None:
        """Let go without waiting: the zygote kills it, if it still runs."""
        if self.returncode is None:
            self.returncode = VANISHED_CODE
        self._conn.close()


def _running(pid: int) -> bool:
    """Whether `pid` still runs (a zombie the zygote has not reaped yet does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def fork_process(
    zygote: tuple[str, int],
    assignment: dict[str, Any],
    fds: Sequence[int] = (),
    timeout_s: float = PID_REPLY_TIMEOUT_S,
) -> ForkedProcess | None:
    """Ask `zygote` ((socket path, pid)) to fork `assignment`; None when it cannot be reached or
    refuses (the caller then starts the process cold)."""
    conn = connect(zygote[0], timeout_s)
    if conn is None:
        return None
    pid = request_fork(conn, assignment, fds, timeout_s)
    return None if pid is None else ForkedProcess(conn, pid)


__all__ = [
    "ZYGOTE_ENV",
    "ForkedProcess",
    "fork_process",
    "fork_request",
    "request_fork",
    "zygote_env",
    "zygote_from_env",
]
