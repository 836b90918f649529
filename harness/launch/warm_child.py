"""A trial component run by a warm process of its slot, forked by a zygote, or else started
cold: one `Child`.

The supervisor sees the same component either way (start, poll, stop, pid file, log). The warm
process runs the component's first start only (a crashed warm process ends itself and `harness
run` replaces it for the next trial); every other start (a restart after a crash or a kill;
every start without a warm process) is forked by the zygote the supervisor's environment names
(`harness.cli_zygote`: `harness run` keeps one when it keeps no warm processes). When neither
can be reached (one died, say), or none is named, the start is cold: warmth saves time and
never decides whether a trial runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.launch.forked_child import ForkedProcess, fork_process, fork_request
from harness.launch.processes import Child
from harness.launch.warm_protocol import VANISHED_CODE, ExitReply, connect, encode

CONNECT_TIMEOUT_S = 5.0
KILL_WAIT_S = 10.0  # SIGKILL is asynchronous; this only bounds a stuck kernel
_CLI_PREFIX = ("-m", "harness.cli")


@dataclass
class WarmChild(Child):
    """`Child`, whose first start goes to the warm process `warm_pid` listening at
    `socket_path` (its pid comes from `harness run`, which started it: the socket's peer
    credentials name `harness run`, which made the socket), and whose other starts (or all of
    them, without a warm process) are forked by `zygote` where one is given and answers."""

    socket_path: str | None = None
    warm_pid: int | None = None
    # (socket path, pid) of a zygote that forks every start no warm process serves.
    zygote: tuple[str, int] | None = None
    # The start the zygote forked; the warm process's connection and exit reply while it runs ours.
    _forked: ForkedProcess | None = field(default=None, repr=False)
    _conn: socket.socket | None = field(default=None, repr=False)
    _reply: ExitReply | None = field(default=None, repr=False)

    def start(self) -> None:
        path, self.socket_path = self.socket_path, None  # warm once; a restart starts fresh
        self._close()
        self._forked, self._conn, self._reply = None, None, None
        warm = path is not None and self.warm_pid is not None and self._runs_harness_cli()
        conn = connect(path, CONNECT_TIMEOUT_S) if warm else None
        if conn is None:
            self._start_fresh()
            return
        self._mark_log_start()
        self.process = None
        self._conn, self._reply = conn, ExitReply(conn)
        conn.sendall(encode(self._assignment()))
        conn.setblocking(False)
        assert self.warm_pid is not None  # checked before connecting
        self.write_pid_file(self.warm_pid)

    def _start_fresh(self) -> None:
        """A start no warm process serves: forked by the zygote (`harness.cli_zygote`) where
        one answers, else a cold subprocess (`Child.start`)."""
        self._mark_log_start()
        if self.zygote and self._runs_harness_cli():
            self._forked = fork_process(self.zygote, self._fork_assignment())
        if self._forked is None:
            super().start()
            return
        self.process = None
        self.write_pid_file(self._forked.pid)

    def _fork_assignment(self) -> dict[str, object]:
        # Where a cold child would run: its CPU set, or else wherever this supervisor may.
        return fork_request(
            name=self.name,
            argv=self.args[3:],
            env={**os.environ, **self.env},
            log_path=self.log_path,
            cpus=self.cpus or os.sched_getaffinity(0),
            pinned=bool(self.cpus),
        )

    def _assignment(self) -> dict[str, object]:
        """The warm process's: a fork's, pinned per assignment (it runs trials one after
        another, and one without CPU sets gets back the mask the process started with)."""
        assignment = self._fork_assignment()
        del assignment["pinned"]
        return assignment | {"cpus": sorted(self.cpus) if self.cpus else None}

    def _mark_log_start(self) -> None:
        log_path = Path(self.log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_start = log_path.stat().st_size if log_path.exists() else 0

    def poll(self) -> int | None:
        if self._forked is not None:
            return self._forked.poll()
        if self._reply is None:
            return super().poll()
        return self._reply.poll()

    @property
    def pid(self) -> int | None:
        if self._forked is not None:
            return self._forked.pid
        if self._conn is None:
            return super().pid
        return self.warm_pid

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the warm or forked process (a generator finishes its round; a learner dies),
        then SIGKILL it if it has not answered within `timeout_s`."""
        if self._conn is None and self._forked is None:
            super().stop(timeout_s)
            return
        if self.poll() is not None:
            self._close()
            return
        self._signal(signal.SIGTERM)
        if not self._wait(timeout_s):
            self._signal(signal.SIGKILL)
            self._wait(KILL_WAIT_S)
        self._close()

    def _runs_harness_cli(self) -> bool:
        return tuple(self.args[1:3]) == _CLI_PREFIX

    def _wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.poll() is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _signal(self, signum: int) -> None:
        if self._forked is not None:  # it leads its own session, as a cold child does
            self._forked.send_signal(signum)
        elif self.warm_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.warm_pid, signum)

    def _close(self) -> None:
        if self._forked is not None:
            self._forked.close()  # a poll after this must not report a running one
        if self._reply is not None and self._reply.code is None:
            self._reply.code = VANISHED_CODE
        if self._conn is not None:
            self._conn.close()


__all__ = ["WarmChild"]
