"""Run trials as subprocesses, at most `max_parallel` at once, and never leave one behind.

Each trial runs in its own session, so its process group holds the trial runner and whatever
it starts without a session of its own, and gets SIGTERM if `harness run` dies (even by SIGKILL:
PR_SET_PDEATHSIG), so a killed driver leaves no trial running on behind a re-run. Stopping a
trial means SIGTERM to that group, a grace period for the runner to tear its components down,
then SIGKILL to the group and to every descendant seen when the stop began (components that
started their own sessions included). The pool does this for every trial still running when it
is closed, whatever the reason (Ctrl-C, SIGTERM, an exception, a timeout), and also kills
stragglers left in a trial's group after it exited normally.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from datetime import UTC, datetime

import psutil

from contract.record import TrialRecordError, read_trial_record
from contract.trial import LaunchStatus
from harness.launch.processes import die_with_parent, open_private
from harness.launch.trials import (
    CommandBuilder,
    PlannedTrial,
    PoolLimits,
    RunningTrial,
    TrialExit,
    exit_status,
)
from harness.launch.warm_slots import WarmSlots

POLL_S = 0.1  # how often a waiting pool looks at its children


def _signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed user (setuid); nothing more we may do
        return False
    return True


def _group_alive(pgid: int) -> bool:
    return _signal_group(pgid, 0)


def _descendants(pid: int) -> list[psutil.Process]:
    """Every process below `pid` now, in whatever session it put itself."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def stop_group(
    pgid: int,
    grace_s: float,
    process: subprocess.Popen[bytes] | None = None,
    tree: list[psutil.Process] | None = None,
) -> None:
    """SIGTERM the group, wait up to `grace_s` for it to empty, then SIGKILL what is left.

    Why the descendant snapshot: the trial runner starts its components in their own sessions
    (so a terminal Ctrl-C reaches only the supervisor), out of reach of a group signal. They
    get the grace period to be torn down by the runner (or by PR_SET_PDEATHSIG when it dies);
    whatever still runs after it is SIGKILLed. The snapshot is taken first because once the
    runner is gone its children are re-parented and no longer findable. `process` (the group
    leader) is reaped on the way, so it cannot linger as a zombie that keeps the group alive.
    `tree`: a snapshot taken earlier (before an earlier signal could have killed the runner).
    """
    if tree is None:
        tree = _descendants(pgid) if process is not None and process.poll() is None else []
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        leader_gone = process is None or process.poll() is not None
        if leader_gone and not _group_alive(pgid) and not _running(tree):
            return
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    survivors = _running(tree)
    for proc in survivors:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(survivors, timeout=10)  # SIGKILL is asynchronous; 10 s bounds a stuck kernel
    if process is not None:
        process.wait(timeout=10)  # SIGKILL cannot be ignored; 10 s only bounds a stuck kernel


class SubprocessTrialPool:
    """At most `max_parallel` trial processes; output of each goes to `TRIAL_DIR/trial.log`."""

    def __init__(
        self,
        command: CommandBuilder,
        limits: PoolLimits,
        env: dict[str, str] | None = None,
        warm: WarmSlots | None = None,
    ) -> None:
        """`warm`: slots of warm component processes the trials use (None: cold components)."""
        if limits.max_parallel < 1:
            raise ValueError(f"max_parallel={limits.max_parallel} must be >= 1")
        self.command = command
        self.max_parallel = limits.max_parallel
        self.kill_grace_s = limits.kill_grace_s
        self.trial_timeout_s = limits.trial_timeout_s
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("PYTHONUNBUFFERED", "1")  # so trial.log is live, not block-buffered
        self.running: dict[str, RunningTrial] = {}
        self.interrupted: int | None = None  # the signal that interrupted the pool, if any
        self.warm = warm
        self._closing = False

    def has_room(self) -> bool:
        return len(self.running) < self.max_parallel and self.interrupted is None

    def start(self, spec: PlannedTrial, resume: bool) -> RunningTrial:
        """Start one trial in its own session, appending its output to trial.log."""
        if not self.has_room():
            raise RuntimeError(f"cannot start {spec.trial_name}: the pool is full or interrupted")
        argv = self.command(spec, resume)
        spec.trial_dir.mkdir(parents=True, exist_ok=True)
        slot, env = None, self.env
        if self.warm is not None:
            slot, warm_env = self.warm.lease(self.env)
            env = {**self.env, **warm_env}
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        with open_private(spec.paths.trial_log) as log:  # 0600, like every log
            log.write(f"\n=== harness {stamp}: {shlex.join(argv)}\n".encode())
            log.flush()
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session, and SIGTERM (a Ctrl-C's teardown) when this process dies.
                preexec_fn=die_with_parent,  # noqa: PLW1509 - the pool starts trials from one thread
                env=env,
            )
        trial = RunningTrial(spec, resume, process, time.monotonic(), slot=slot)
        self.running[spec.trial_name] = trial
        return trial

    def reap(self) -> list[TrialExit]:
        """Collect trials that exited (or ran past `trial_timeout_s`); never blocks long."""
        exits = []
        for name, trial in list(self.running.items()):
            returncode = trial.process.poll()
            timed_out = False
            if returncode is None and self._over_time(trial):
                stop_group(trial.process.pid, self.kill_grace_s, trial.process)
                returncode, timed_out = trial.process.returncode, True
            if returncode is None:
                continue
            del self.running[name]
            exits.append(self._finish(trial, returncode, timed_out))
        return exits

    def wait_any(self, timeout_s: float) -> list[TrialExit]:
        """Reap, polling every POLL_S, until a trial exits or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            exits = self.reap()
            if exits or not self.running or time.monotonic() >= deadline:
                return exits
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def interrupt(self, signum: int) -> None:
        """Stop all trials: SIGTERM their groups now, SIGKILL on a second interrupt."""
        forceful = self.interrupted is not None
        self.interrupted = signum
        for trial in list(self.running.values()):
            if trial.tree is None:  # before the runner can die and orphan its components
                trial.tree = _descendants(trial.process.pid)
            _signal_group(trial.process.pid, signal.SIGKILL if forceful else signal.SIGTERM)

    def close(self) -> list[TrialExit]:
        """Stop every trial still running (grace, then SIGKILL) and report how each ended."""
        exits = []
        self._closing = True
        for name, trial in list(self.running.items()):
            stop_group(trial.process.pid, self.kill_grace_s, trial.process, trial.tree)
            del self.running[name]
            exits.append(self._finish(trial, trial.process.returncode, stopped=True))
        if self.warm is not None:
            self.warm.close()
        return exits

    def __enter__(self) -> SubprocessTrialPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _over_time(self, trial: RunningTrial) -> bool:
        if self.trial_timeout_s is None:
            return False
        return time.monotonic() - trial.started > self.trial_timeout_s

    def _finish(
        self, trial: RunningTrial, returncode: int, timed_out: bool = False, stopped: bool = False
    ) -> TrialExit:
        """Classify an ended trial. One that finished just as it was stopped keeps its result."""
        pgid = trial.process.pid
        # the runner exited but left children behind: in its group, or (seen at an interrupt)
        # in sessions of their own
        leftovers = _group_alive(pgid) or bool(_running(trial.tree or []))
        if leftovers:
            trial.left_processes = True
            stop_group(pgid, self.kill_grace_s, tree=trial.tree)
        if timed_out:
            message = f"timed out after {self.trial_timeout_s:g} s; its process group was killed"
            return self._exit(trial, returncode, LaunchStatus.FAILED, message)
        try:
            record = read_trial_record(trial.spec.trial_dir)
        except TrialRecordError as exc:
            record, problem = None, str(exc)
        else:
            problem = None
        status, message = exit_status(returncode, record)
        if status == LaunchStatus.FAILED and (stopped or self.interrupted is not None):
            stopped_by = "stopped by the harness"
            return self._exit(trial, returncode, LaunchStatus.INTERRUPTED, stopped_by)
        if problem is not None:
            message = problem
        if leftovers:
            message += "; it left processes behind, which were killed"
        return self._exit(trial, returncode, status, message)

    def _exit(
        self, trial: RunningTrial, returncode: int | None, status: LaunchStatus, message: str
    ) -> TrialExit:
        if self.warm is not None and trial.slot is not None:
            # Only a trial that ended well, leaving nothing behind, hands its warm processes
            # on; after any other ending the next trial of the slot gets fresh ones.
            ended_well = status in (LaunchStatus.COMPLETED, LaunchStatus.DIVERGED)
            self.warm.release(
                trial.slot,
                keep=ended_well and not trial.left_processes,
                refill=self.interrupted is None and not self._closing,  # no trial follows
            )
        duration = time.monotonic() - trial.started
        return TrialExit(trial.spec, trial.resume, returncode, status, message, duration)


__all__ = ["POLL_S", "SubprocessTrialPool", "stop_group"]
