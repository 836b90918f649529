"""`python -m harness.cli_zygote`: a process that imports the components' libraries once and
forks each cold component start from there (a "zygote", as Android and Chromium call theirs).

Why: a cold component pays ~5 CPU-seconds importing torch and transformers before it does any
work. `harness run` (and the test suite) start hundreds of them: every first start with
`executor.warm_components: false`, every restart after a crash or a kill, and with warm
components every warm process of every slot. Forked from a process that already imported
everything, a component starts in a few milliseconds of CPU.

What a forked component shares with a cold one, and why it computes the same:
- it runs `harness.cli` with the supervisor's argv, environment, working directory and CPU
  set, output appended to its own log, in its own session (so the supervisor's killpg reaches
  it and nothing else), as `python -m harness.cli ...` would;
- the zygote itself never runs a torch operation (its intra-op pool is not started, so each
  child starts its own) and never seeds anything: every component seeds its generators and sets
  its thread counts itself (design section 1), as a cold one does; Python's `random` is reseeded
  in the child by the interpreter's own fork hook;
- it dies with the zygote (PR_SET_PDEATHSIG), the zygote dies with whoever started it, and it is
  SIGKILLed the moment its supervisor's connection closes (the supervisor died, even by SIGKILL):
  a forked component outlives its supervisor no longer than a cold one does.

The protocol (JSON lines, never pickles: rule 5; peers checked to be this user):

    supervisor -> zygote:  {"argv": [...], "env": {...}, "cwd": "...", "log": "...",
                            "cpus": [...], "name": "learner"}
    zygote -> supervisor:  {"pid": 1234}      once forked
    zygote -> supervisor:  {"exit": 0}        once it ended (-N: killed by signal N)

A request with `"module": "harness.cli_warm"` and one descriptor (SCM_RIGHTS: the listening
socket `harness run` made for a slot's warm process) forks a warm process instead; `harness run`
holds its connection for the warm process's life. Nothing else can be asked to run.

Unlike a warm process (`harness.cli_warm`), which runs one trial's component in itself and is
replaced after a failure, the zygote is never the component: it serves any number of starts,
side by side, and a crash of one never touches it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from harness.launch.affinity import pinned_line
from harness.launch.processes import exit_code_of, open_private
from harness.launch.warm_protocol import (
    MAX_MESSAGE_BYTES,
    ProtocolError,
    decode,
    encode,
    same_user,
)

# What a zygote imports before its first fork: what a cold learner and a cold torch generator
# import (`cli_warm.PRELOADS` without vLLM: its engine is kept by warm processes instead).
PRELOADS: tuple[str, ...] = (
    "harness.cli",
    "harness.trial.learner_main",
    "harness.trial.generator_main",
    "harness.evaluation.suite",
    "harness.generators.torch_backend",
)
CLI, WARM = "harness.cli", "harness.cli_warm"  # what a request may run
REQUEST_TIMEOUT_S = 5.0  # a peer that connects and sends nothing does not stall the others
_PR_SET_PDEATHSIG = 1
# The zygote's working directory, first on its import path as `python -m` put it there.
_STARTED_IN = os.getcwd()
# Loaded here, before any fork: a child loads no library before it becomes the component.
_LIBC = ctypes.CDLL("libc.so.6", use_errno=True) if sys.platform.startswith("linux") else None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.cli_zygote")
    parser.add_argument("--fd", type=int, required=True, help="a bound, listening Unix socket")
    args = parser.parse_args(argv)
    listener = socket.socket(fileno=args.fd)
    for module in PRELOADS:
        importlib.import_module(module)
    # Out of the collector's reach: a child's collections would otherwise touch (and so copy)
    # every page of what was imported here.
    gc.freeze()
    print(f"zygote {os.getpid()}: ready ({len(sys.modules)} modules imported)", flush=True)
    Zygote(listener).serve()


class Zygote:
    """The fork server's loop: accept starts, fork them, report each one's exit."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket | None] = {}  # pid -> its supervisor's connection
        self.by_connection: dict[socket.socket, int] = {}
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        self.wake_read, self.wake_write = wake_read, wake_write

    def serve(self) -> NoReturn:
        # SIGCHLD wakes the select below through the wakeup fd; the handler itself does nothing.
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_read, selectors.EVENT_READ, "child")
        while True:
            for key, _ in self.selector.select():
                if key.data == "accept":
                    self._accept()
                elif key.data == "child":
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_read, 4096):
                            pass
                else:
                    self._watch(key.fileobj)  # type: ignore[arg-type]
            self._reap()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        if not same_user(conn):
            conn.close()
            return
        conn.settimeout(REQUEST_TIMEOUT_S)
        try:
            assignment, fds = _read_request(conn)
        except (ProtocolError, OSError) as exc:
            print(f"zygote: ignored a bad request: {exc}", flush=True)
            conn.close()
            return
        ready_read, ready_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready_read)
            self._become(assignment, conn, ready_write, fds)
        os.close(ready_write)
        for fd in fds:  # the child's now
            os.close(fd)
        # Reply only once the child leads its own session: a supervisor's killpg right after
        # the start must reach it, as it reaches a cold child once Popen returned.
        with contextlib.suppress(OSError):
            os.read(ready_read, 1)
        os.close(ready_read)
        self.children[pid] = conn
        self.by_connection[conn] = pid
        try:
            conn.sendall(encode({"pid": pid}))
        except OSError:
            self._abandon(conn)
            return
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ, "supervisor")

    def _watch(self, conn: socket.socket) -> None:
        """The supervisor wrote (it never does) or closed: closed while its component runs
        means it died, so the component dies now, as a cold one would by PR_SET_PDEATHSIG."""
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._abandon(conn)

    def _abandon(self, conn: socket.socket) -> None:
        pid = self.by_connection.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn)
        conn.close()
        if pid is not None:
            self.children[pid] = None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            cpu_s = usage.ru_utime + usage.ru_stime
            print(f"zygote: {pid} ended ({code}) after {cpu_s:.2f} CPU-s", flush=True)
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            self.by_connection.pop(conn, None)
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn)
            with contextlib.suppress(OSError):
                conn.setblocking(True)
                conn.sendall(encode({"exit": code}))
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _become(
        self, assignment: dict[str, Any], conn: socket.socket, ready: int, fds: list[int]
    ) -> NoReturn:
        """In the forked child: leave the server behind, become the component (or warm
        process), exit with its code (never returns: the server's loop must not run on in a
        child). `ready` is closed once this process leads its own session and dies with the
        zygote; `fds` came with the request (a warm process's listening socket)."""
        code = 1
        try:
            parent = os.getppid()
            os.setsid()
            _die_with(parent)
            os.close(ready)
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(signum, signal.SIG_DFL)
            self.selector.close()
            for fd in (self.wake_read, self.wake_write, self.listener.fileno(), conn.fileno()):
                with contextlib.suppress(OSError):
                    os.close(fd)
            for other in self.by_connection:
                with contextlib.suppress(OSError):
                    os.close(other.fileno())
            code = run_component(assignment, fds)
        except BaseException:
            with contextlib.suppress(BaseException):
                traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code if 0 <= code <= 255 else 1)


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request line, and the descriptors sent with it (SCM_RIGHTS: they arrive with its
    first bytes). A request runs `harness.cli` (a component) or `harness.cli_warm` with a
    listening socket (a warm process of `harness run`'s slots); nothing else."""
    data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE_BYTES, 4)
    try:
        while data and not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk or len(data) > MAX_MESSAGE_BYTES:
                raise ProtocolError("the request ended before its line did")
            data += chunk
        if not data:
            raise ProtocolError("the connection closed before a request")
        assignment = decode(data[:-1])
        module = assignment.get("module", CLI)
        if module not in (CLI, WARM) or (module == WARM) != (len(fds) == 1):
            raise ProtocolError(f"cannot run {module!r} with {len(fds)} descriptors")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return assignment, fds


def run_component(assignment: dict[str, Any], fds: Sequence[int] = ()) -> int:
    """Run `harness.cli` (or `harness.cli_warm`, serving on the passed socket) with the
    assignment's argv in this (forked) process, in the requester's environment, working
    directory and CPU set, output to the component's (or warm process's) log."""
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in dict(assignment["env"]).items()})
    os.chdir(str(assignment["cwd"]))
    cpus = assignment.get("cpus")
    if isinstance(cpus, list) and cpus and all(isinstance(c, int) for c in cpus):
        os.sched_setaffinity(0, cpus)  # one thread now: every later one inherits it
    _import_paths_of(os.getcwd(), os.environ.get("PYTHONPATH", ""))
    cli_path = str(getattr(sys.modules["harness.cli"], "__file__", "harness"))
    sys.argv = [cli_path, *[str(a) for a in assignment["argv"]]]
    _output_to(Path(str(assignment["log"])))
    if assignment.get("module", CLI) == WARM:
        print(f"warm process {os.getpid()}: forked by zygote {os.getppid()}", flush=True)
        return _run_warm([str(a) for a in assignment["argv"]], fds[0])
    from harness.cli import app

    print(f"component process {os.getpid()}: forked by zygote {os.getppid()}", flush=True)
    if assignment.get("pinned"):
        name = str(assignment.get("name") or "component")
        print(pinned_line(name, os.getpid(), frozenset(os.sched_getaffinity(0))), flush=True)
    try:
        app(args=[str(a) for a in assignment["argv"]], prog_name="harness", standalone_mode=True)
    except SystemExit as exc:
        return exit_code_of(exc.code)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _run_warm(argv: list[str], listener_fd: int) -> int:
    """`python -m harness.cli_warm ARGV --fd N` in this process: it serves trials until one
    fails or it is killed, and leaves by os._exit (its code is only reached on a bad argv)."""
    from harness import cli_warm

    try:
        cli_warm.main([*argv, "--fd", str(listener_fd)])
    except SystemExit as exc:
        return exit_code_of(exc.code)
    return 0


def _import_paths_of(cwd: str, pythonpath: str) -> None:
    """The import path a cold `python -m harness.cli` would have here: its working directory
    first (where the zygote's was), then the supervisor's PYTHONPATH (a plugin's directory,
    say), ahead of what the zygote had."""
    if sys.path and sys.path[0] == _STARTED_IN:
        sys.path[0] = cwd
    extra = [entry for entry in pythonpath.split(os.pathsep) if entry and entry not in sys.path]
    sys.path[1:1] = extra


def _output_to(log_path: Path) -> None:
    """stdin from /dev/null; stdout and stderr (the descriptors: C libraries write there too)
    appended to the component's 0600 log, as a cold component's are."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    with open_private(log_path) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)


def _die_with(parent: int) -> None:
    """SIGKILL this child the moment the zygote dies; if it already has, exit now."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


if __name__ == "__main__":
    main()
