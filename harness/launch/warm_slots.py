"""The warm component processes of each slot of a trial pool (`executor.warm_components`).

A slot is one of the pool's `max_parallel` places for a trial. It keeps one warm process per
component of a trial (the learner, each generator): started once, importing torch, transformers
and vLLM once, and handed each trial's component in turn (`harness.cli_warm`), so
a trial's components start in well under a second instead of paying imports (and a vLLM engine
start) every time. What a trial records does not depend on it: tests pin warm trials bitwise to
cold ones.

When a trial of the slot fails (or is stopped, or times out), every warm process of the slot is
killed and replaced, so no trial inherits anything from a failed one; a warm process that died
during a successful trial (a SIGKILLed component, restarted cold by the supervisor) is replaced
too. Each process dies with `harness run` (PR_SET_PDEATHSIG) and with its trial's supervisor
(the connection closes), like a cold component.

The listening socket is made here and inherited by the warm process, so it accepts connections
from the moment it is spawned: a supervisor that connects while the process still imports waits
in the backlog instead of finding no socket and starting cold.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness.launch.forked_child import (
    ForkedProcess,
    fork_process,
    fork_request,
    zygote_env,
    zygote_from_env,
)
from harness.launch.processes import listening_socket, spawn_listening
from harness.launch.warm_protocol import warm_components_env

KILL_WAIT_S = 10.0  # SIGKILL is asynchronous; this only bounds a stuck kernel
# A zygote `harness run` just started is still importing when the first slot is filled: its
# reply may take its import time (seconds; more on a loaded machine).
FORK_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class WarmPlan:
    """What each slot keeps warm: component name -> what it preloads (`cli_warm.PRELOADS`
    keys), e.g. {"learner": ("learner",), "generator-0": ("generator", "vllm")}."""

    components: dict[str, tuple[str, ...]]
    # Also keep a zygote (`harness.cli_zygote`), unless the environment already names one: it
    # forks the warm processes themselves and every start no warm process serves (all of them
    # without warm components; every restart).
    zygote: bool = False


@dataclass
class WarmProcess:
    """One warm component process and the socket it listens on: spawned (a fresh interpreter)
    or forked by a zygote (`ForkedProcess`, which answers as much of Popen as is used here)."""

    name: str
    socket_path: Path
    process: subprocess.Popen[bytes] | ForkedProcess

    @classmethod
    def spawn(
        cls, name: str, preload: tuple[str, ...], socket_path: Path, log_path: Path, env: dict
    ) -> WarmProcess:
        args = ["-m", "harness.cli_warm", *_preload_args(preload)]
        return cls(name, socket_path, spawn_listening(args, socket_path, log_path, env))

    @classmethod
    def fork(
        cls,
        name: str,
        preload: tuple[str, ...],
        socket_path: Path,
        log_path: Path,
        *,
        env: dict[str, str],
        zygote: tuple[str, int],
    ) -> WarmProcess | None:
        """The same process forked by `zygote` (torch and transformers already imported there;
        a vLLM preload is imported by the fork), or None where the zygote does not answer.
        Its listening socket is made here and passed along, as `spawn` passes it to a child."""
        listener = listening_socket(socket_path)
        try:
            assignment = fork_request(
                name=name,
                argv=_preload_args(preload),
                env=env,
                log_path=log_path,
                cpus=os.sched_getaffinity(0),
                module="harness.cli_warm",
            )
            forked = fork_process(zygote, assignment, [listener.fileno()], FORK_TIMEOUT_S)
        finally:
            listener.close()  # the fork holds the only listening copy now (if any)
        if forked is None:
            socket_path.unlink(missing_ok=True)
            return None
        return cls(name, socket_path, forked)

    @classmethod
    def spawn_zygote(cls, socket_path: Path, log_path: Path, env: dict[str, str]) -> WarmProcess:
        """A zygote (`harness.cli_zygote`): kept, killed and cleaned up as a warm process is;
        the supervisors it serves find it by `zygote_env`."""
        args = ["-m", "harness.cli_zygote"]
        return cls("zygote", socket_path, spawn_listening(args, socket_path, log_path, env))

    @property
    def zygote_env(self) -> dict[str, str]:
        """What a supervisor's environment needs to fork its components from this zygote."""
        return zygote_env(self.socket_path, self.process.pid)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=KILL_WAIT_S)
        if isinstance(self.process, ForkedProcess):
            self.process.close()
        self.socket_path.unlink(missing_ok=True)


def _preload_args(preload: tuple[str, ...]) -> list[str]:
    return [arg for item in preload for arg in ("--preload", item)]


@dataclass
class _Slot:
    index: int
    processes: dict[str, WarmProcess] = field(default_factory=dict)
    busy: bool = False


class WarmSlots:
    """`slots` slots of warm processes, spawned on the first lease (with the pool's environment
    of that moment), replaced when a trial fails, killed on close."""

    def __init__(self, plan: WarmPlan, slots: int, log_dir: Path) -> None:
        self.plan = plan
        self.log_dir = log_dir
        self._slots = [_Slot(index) for index in range(slots)]
        self._socket_dir: Path | None = None
        self._env: dict[str, str] = {}
        self._zygote: WarmProcess | None = None
        self._fork_from: tuple[str, int] | None = None  # the zygote the warm processes fork from
        self.spawned = 0  # warm processes started so far (a benchmark and the tests read it)
        self.forked = 0  # of which forked by a zygote

    def lease(self, env: dict[str, str]) -> tuple[int, dict[str, str]]:
        """A free slot for a trial, and what to add to the trial's environment."""
        if self._socket_dir is None:
            # Unix socket paths are limited to 107 bytes: a short private directory, not the
            # (possibly long) output directory.
            self._socket_dir = Path(tempfile.mkdtemp(prefix="harness-warm-"))
            self._env = dict(env)
            self._fork_from = zygote_from_env(env)
            if self.plan.zygote and self._fork_from is None:
                self._zygote = WarmProcess.spawn_zygote(
                    self._socket_dir / "zygote.sock", self.log_dir / "zygote.log", self._env
                )
                self._fork_from = zygote_from_env(self._zygote.zygote_env)
            for slot in self._slots:
                self._fill(slot)
        slot = next(slot for slot in self._slots if not slot.busy)
        slot.busy = True
        self._fill(slot)  # any process that died since
        table = {
            name: (str(proc.socket_path), proc.process.pid) for name, proc in slot.processes.items()
        }
        zygote = self._zygote.zygote_env if self._zygote is not None else {}
        return slot.index, {**(warm_components_env(table) if table else {}), **zygote}

    def release(self, index: int, *, keep: bool, refill: bool = True) -> None:
        """The slot's trial ended; `keep=False` (it failed, or was stopped): its processes are
        killed. Dead and killed ones are replaced at once unless `refill=False` (the pool is
        closing: no trial follows)."""
        slot = self._slots[index]
        slot.busy = False
        for name, proc in list(slot.processes.items()):
            if not keep or not proc.alive():
                proc.kill()
                del slot.processes[name]
        if refill:
            self._fill(slot)

    def pids(self, index: int) -> dict[str, int]:
        """The pids of slot `index`'s warm processes by component name (alive or not)."""
        return {name: proc.process.pid for name, proc in self._slots[index].processes.items()}

    def close(self) -> None:
        for slot in self._slots:
            for proc in slot.processes.values():
                proc.kill()
            slot.processes.clear()
        if self._zygote is not None:
            self._zygote.kill()
            self._zygote = None
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    def _fill(self, slot: _Slot) -> None:
        assert self._socket_dir is not None
        for name, preload in self.plan.components.items():
            proc = slot.processes.get(name)
            if proc is not None and proc.alive():
                continue
            if proc is not None:
                proc.kill()
            socket_path = self._socket_dir / f"s{slot.index}-{name}.sock"
            log_path = self.log_dir / f"slot-{slot.index}-{name}.log"
            forked = None
            if self._fork_from is not None:
                forked = WarmProcess.fork(
                    name, preload, socket_path, log_path, env=self._env, zygote=self._fork_from
                )
            slot.processes[name] = forked or WarmProcess.spawn(
                name, preload, socket_path, log_path, self._env
            )
            self.spawned += 1
            self.forked += forked is not None


__all__ = ["WarmPlan", "WarmProcess", "WarmSlots"]
