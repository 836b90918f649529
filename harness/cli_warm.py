"""`python -m harness.cli_warm`: a learner or generator process kept across trials.

`harness run` starts one per component of each slot (`harness.launch.warm_slots`); it imports
torch, transformers (and vLLM) once, then runs one trial's component at a time, in this process,
exactly as `python -m harness.cli learner|generator ...` would run it: the same argv, the
supervisor's environment and working directory, output appended to the component's own log.
A vLLM engine outlives the trial (`harness.generators.kept_engines`) and is put back on the next
trial's initial weights.

What a trial could leave behind, and why none of it reaches the next one:
- a failure: any exit code but 0 ends this process after the reply, so the slot gets a fresh
  one (a crashed or killed component is never reused, as in a cold start);
- signal handlers (a generator routes SIGTERM to its stop latch): put back to the defaults
  after every trial, so a late SIGTERM kills the process rather than latch a finished trial;
- environment, working directory, stdout/stderr: restored after every trial;
- random state and thread counts: every component seeds and sets them itself at its start
  (design section 1), which is what makes fixed mode bitwise in the first place;
- CPU affinity (`executor.cpu_sets`): every thread of this process is pinned at the start of
  each assignment, to the assignment's CPUs or, without any, back to the mask this process
  started with.
The supervisor keeps the connection open while the component runs; if it closes (the
supervisor died, even by SIGKILL), this process exits at once, as a cold component would by
PR_SET_PDEATHSIG.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from harness.launch.affinity import pin_all_threads, pinned_line
from harness.launch.processes import exit_code_of, open_private
from harness.launch.warm_protocol import (
    WARM_ENGINES_ENV,
    ProtocolError,
    decode,
    encode,
    read_line,
    same_user,
)

# What each kind of component imports before its first trial (what a cold start pays each time).
PRELOADS: dict[str, tuple[str, ...]] = {
    "learner": ("harness.cli", "harness.trial.learner_main", "harness.evaluation.suite"),
    "generator": ("harness.cli", "harness.trial.generator_main"),
    "torch": ("harness.generators.torch_backend",),
    "vllm": ("vllm", "harness.generators.vllm_backend"),
}
# Exit code of a warm process whose supervisor went away mid-trial.
SUPERVISOR_GONE_CODE = 137
RESET_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# The CPUs this process may use as started (`harness run`'s): an assignment without CPU sets
# runs on these, whatever an earlier assignment was pinned to.
_STARTED_ON: frozenset[int] = frozenset(os.sched_getaffinity(0))


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    listener = socket.socket(fileno=args.fd)  # bound and listening: made by `harness run`
    for name in args.preload:
        for module in PRELOADS[name]:
            importlib.import_module(module)
    serve(listener)


def serve(listener: socket.socket) -> None:
    """Run trials handed over `listener` one at a time, until one fails or this is killed."""
    served = 0
    while True:
        conn, _ = listener.accept()
        with conn:
            if not same_user(conn):
                continue
            try:
                assignment = decode(read_line(conn))
            except (ProtocolError, OSError) as exc:
                print(f"warm component: ignored a bad request: {exc}", flush=True)
                continue
            served += 1
            code = run_assignment(assignment, conn, served)
            with contextlib.suppress(OSError):
                conn.sendall(encode({"exit": code}))
                # wakes the thread waiting on the connection (a close alone would not)
                conn.shutdown(socket.SHUT_RDWR)
        if code != 0:  # whatever a failed trial left in this process dies with it
            _exit(code)


def run_assignment(assignment: dict[str, Any], conn: socket.socket, served: int) -> int:
    """Run one trial's component as `python -m harness.cli ARGV` would; its exit code.
    `served`: how many trials this process has run, this one included (its log says so)."""
    from harness.cli import app

    finished = threading.Event()
    threading.Thread(target=_exit_when_closed, args=(conn, finished), daemon=True).start()
    with (
        _environment(assignment["env"], assignment["cwd"]),
        _output_to(Path(assignment["log"])),
    ):
        print(f"warm component process {os.getpid()}: trial {served} of this process", flush=True)
        try:
            _pin(assignment)
            app(args=list(assignment["argv"]), prog_name="harness", standalone_mode=True)
            code = 0
        except SystemExit as exc:
            code = exit_code_of(exc.code)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            finished.set()
            for signum in RESET_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
    return code


def _pin(assignment: dict[str, Any]) -> None:
    """Pin every thread of this process (those earlier trials started included) to the
    assignment's CPUs, or back to the CPUs it started on; a pinned one is logged."""
    cpus = assignment.get("cpus")
    if not (isinstance(cpus, list) and cpus and all(isinstance(c, int) for c in cpus)):
        pin_all_threads(_STARTED_ON)
        return
    pin_all_threads(frozenset(cpus))
    name = str(assignment.get("name") or "component")
    applied = frozenset(os.sched_getaffinity(0))  # what the kernel applied
    print(pinned_line(name, os.getpid(), applied), flush=True)


def _exit_when_closed(conn: socket.socket, finished: threading.Event) -> None:
    """Wait for the supervisor's end of the connection; gone mid-trial: end this process."""
    with contextlib.suppress(OSError):
        conn.recv(1)
    if not finished.is_set():
        _exit(SUPERVISOR_GONE_CODE)


@contextlib.contextmanager
def _environment(env: dict[str, str], cwd: str) -> Iterator[None]:
    """The supervisor's environment and working directory for one trial, then this process's."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.environ[WARM_ENGINES_ENV] = "1"  # what lets `kept_engines` keep an engine for later
    os.chdir(cwd)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)


@contextlib.contextmanager
def _output_to(log_path: Path) -> Iterator[None]:
    """stdout and stderr (the file descriptors: C libraries write there too) appended to the
    component's log, 0600 like every log; this process's own output afterwards."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open_private(log_path) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def _exit(code: int) -> None:
    """Leave without the interpreter's teardown (unloading torch and vLLM takes seconds)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if 0 <= code <= 255 else 1)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.cli_warm")
    parser.add_argument("--fd", type=int, required=True, help="listening Unix socket (inherited)")
    parser.add_argument("--preload", action="append", default=[], choices=sorted(PRELOADS))
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
