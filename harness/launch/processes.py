"""Child processes that never outlive their parent, and their private logs.

Every component runs in its own process group (so a Ctrl-C in the terminal reaches only the
supervisor, which then decides the order of teardown) and asks the kernel to SIGKILL it when the
supervisor dies (PR_SET_PDEATHSIG), so even a SIGKILLed supervisor leaves no orphan: its
components are gone within a second, its embedded Redis (SIGTERM: it fsyncs its AOF) too. Its
log is private to the user (0600 in a 0700 directory): logs quote prompts, responses and paths.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from harness.launch.affinity import pinned_line

_PR_SET_PDEATHSIG = 1
# A component exiting with this code hit an error a restart cannot fix (a config value too small
# for the data, say; its last log line says which): the supervisor fails the trial at once with
# that line instead of restarting it. 78 is EX_CONFIG of BSD's sysexits.h.
EXIT_NO_RESTART = 78
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) if needed and make it 0700; returns it."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(PRIVATE_DIR_MODE)
    return path


def open_private(path: Path, *, append: bool = True) -> BinaryIO:
    """Open `path` for writing (appending, or else truncated) as a 0600 file in a 0700 directory;
    an existing file (an older 0644 log) is made 0600 too."""
    private_dir(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, PRIVATE_FILE_MODE)
    os.fchmod(fd, PRIVATE_FILE_MODE)  # O_CREAT's mode only applies to a new file
    return os.fdopen(fd, "ab" if append else "wb")


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """preexec_fn: a new session, and SIGTERM when the parent dies (even by SIGKILL)."""
    os.setsid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


# Loaded here, in the parent: a forked child should not load libraries before it execs.
_LIBC = ctypes.CDLL("libc.so.6", use_errno=True) if sys.platform.startswith("linux") else None


def die_at_once_with_parent(parent_pid: int) -> None:  # pragma: no cover - in the child
    """preexec_fn of a component: a new session, and SIGKILL the moment the supervisor
    (`parent_pid`) dies, even by SIGKILL.

    SIGKILL, not SIGTERM: a generator catches SIGTERM to finish its round and push it, which
    with the supervisor gone (and its Redis with it) took 9-15 s of generation and reconnect
    attempts; the learner dies of SIGTERM anyway. Nothing is lost: a killed component's work
    is what every resume already redoes. PDEATHSIG follows the thread that forked the child,
    and the supervisor starts (and restarts) components from its one thread. A supervisor
    that died before the prctl would never send the signal, so the child checks and exits.
    """
    os.setsid()
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def start_component(
    parent_pid: int, cpus: frozenset[int] | None
) -> None:  # pragma: no cover - in the child
    """preexec_fn of a component: `die_at_once_with_parent`, then its CPU set
    (`executor.cpu_sets`) before it execs, so it imports torch (which sizes its pools by the
    mask) already pinned, and every thread it starts inherits the mask."""
    die_at_once_with_parent(parent_pid)
    if cpus:
        os.sched_setaffinity(0, cpus)


def die_with_torchrun_agent() -> None:
    """In a learner rank that torchrun started: SIGKILL when the torchrun agent dies.

    The supervisor kills the agent's whole session on stop, but a SIGKILLed supervisor takes
    only its direct child (the agent, by PDEATHSIG); without this its ranks would live on,
    holding the trial's files and a process group nobody joins again. No-op outside torchrun.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or _LIBC is None:
        return
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # pragma: no cover - the agent died before the prctl: orphaned
        os._exit(1)


@dataclass
class Child:
    """A supervised component process with its log file."""

    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    # Where this attempt's output begins in the log, which every attempt appends to: the failure
    # reason (last_line, tail) must come from this attempt, not from an earlier one that logged
    # an error when this one was killed before it wrote anything.
    log_start: int = 0
    # The CPUs it may run on (`executor.cpu_sets`); None: wherever its parent may.
    cpus: frozenset[int] | None = None

    def start(self) -> None:
        log = open_private(self.log_path)
        self.log_start = os.fstat(log.fileno()).st_size
        self.process = subprocess.Popen(
            self.args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
            # The supervisor is single-threaded; prctl(PDEATHSIG) has no spawn-safe equivalent.
            preexec_fn=functools.partial(start_component, os.getpid(), self.cpus),  # noqa: PLW1509
        )
        if self.cpus:
            # Read back from the kernel: the log records the mask applied, not the one asked.
            with contextlib.suppress(ProcessLookupError):
                applied = frozenset(os.sched_getaffinity(self.process.pid))
                line = pinned_line(self.name, self.process.pid, applied)
                log.write((line + "\n").encode())
        log.close()
        self.write_pid_file(self.process.pid)

    def write_pid_file(self, pid: int) -> None:
        """Operators (and the kill/resume tests) find a component by its pid file. It is replaced
        atomically: a reader polling it never sees the empty file between truncate and write."""
        pid_path = self.log_path.with_suffix(".pid")
        staging = pid_path.with_suffix(".pid.tmp")
        with open_private(staging, append=False) as pid_file:
            pid_file.write(str(pid).encode())
        os.replace(staging, pid_path)

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the child's process group, then SIGKILL what is left after `timeout_s`."""
        if self.process is None or self.process.poll() is not None:
            return
        _signal_group(self.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            time.sleep(0.05)
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def last_line(self) -> str:
        """The log's last non-empty line (a component's one-line error), or ''."""
        lines = [line for line in self.tail(lines=5).splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def tail(self, lines: int = 20) -> str:
        """The last `lines` lines this attempt logged (the whole log if it was replaced by a
        shorter one since, e.g. pulled from a bucket)."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return ""
        ours = data[self.log_start :] if len(data) >= self.log_start else data
        return "\n".join(ours.decode(errors="replace").splitlines()[-lines:])


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def listening_socket(socket_path: Path) -> socket.socket:
    """A Unix socket bound at `socket_path` (0600, replacing a stale one) and listening: made by
    whoever starts the process that serves it, so connections wait in its backlog from the
    start."""
    socket_path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(socket_path))
        socket_path.chmod(0o600)
        listener.listen(8)
    except BaseException:
        listener.close()
        raise
    return listener


def spawn_listening(
    args: list[str], socket_path: Path, log_path: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """`python ARGS --fd N`, N a Unix socket bound at `socket_path` (0600) and listening, made
    here so connections wait in its backlog while the process still imports; output appended to
    `log_path`. Its own session; SIGKILLed the moment this process dies (`harness run` starts
    these from its main thread, as it does trials)."""
    listener = listening_socket(socket_path)
    try:
        fd = listener.fileno()
        with open_private(log_path) as log:
            return subprocess.Popen(
                [sys.executable, *args, "--fd", str(fd)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                pass_fds=(fd,),
                preexec_fn=functools.partial(die_at_once_with_parent, os.getpid()),  # noqa: PLW1509
            )
    finally:
        listener.close()  # the child holds the only listening copy now


def exit_code_of(code: object) -> int:
    """The exit code of a process whose main raised SystemExit(`code`) (a component run inside
    a warm process or a zygote's child): as the interpreter would exit, message printed."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"), as the interpreter would print it
    return 1


def python_module_args(module: str, *args: str) -> list[str]:
    """Run `python -m module args` with the interpreter of this process (the project's venv)."""
    return [sys.executable, "-m", module, *args]
