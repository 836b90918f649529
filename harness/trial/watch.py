"""Start a trial's components and watch them until the trial ends.

The learner and the generator(s) run where the executor's launcher puts them, sharing nothing
but Redis and the weight store (design section 3). A crashed generator is restarted under its
old id, first expiring the leases of the tickets it held (the process holding them is dead), so
the trial goes on at once instead of after the lease. Restarts are budgeted per unit of progress
(processes.RestartBudget): MAX_GENERATOR_RESTARTS crashes of one generator in a row with no
learner step and no group pushed in between fail the trial; any progress renews the budget. A
generator exiting with EXIT_NO_RESTART (an error a restart cannot fix) fails the trial at once
with its one-line reason. A learner crash fails the trial (resumably).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from buffer.eval_requests import EvalRequests
from buffer.streams import TicketDispenser, connect, request_stop
from contract.layout import TrialPaths
from contract.record import read_json
from contract.trial import TrialSpec, TrialStatus
from harness.config import ExperimentConfig
from harness.executors.base import Component, ComponentLauncher, TrialFailedError
from harness.executors.local import LocalLauncher
from harness.launch.affinity import thread_warnings
from harness.launch.processes import EXIT_NO_RESTART, python_module_args
from harness.signals import SignalLatch
from harness.storage.trial_storage import SupervisorSync
from harness.trial.disk_space import disk_full_line, low_on_space
from harness.trial.restarts import RestartBudget
from learner.runtime.metrics_log import MetricsLog

# Restarts of one generator in a row without progress (a learner step or a pushed group).
MAX_GENERATOR_RESTARTS = 3
POLL_S = 0.2
# A component's grace between SIGTERM and SIGKILL at teardown: a generator finishes its round
# and pushes it, for the resume. With Redis dead there is nothing to push, so it gets a moment.
COMPONENT_GRACE_S = 10.0
REDIS_GONE_GRACE_S = 1.0


@dataclass
class TrialOutcome:
    """How a trial ended, as trial.json records it; `reason` for a failed or diverged one."""

    status: TrialStatus  # completed | diverged | failed
    steps_completed: int
    reason: str | None = None
    redis_gone: bool = False  # the trial's Redis died: no component has anything left to save


def component_args(
    command: str, config_path: Path, spec: TrialSpec, paths: TrialPaths, steps: int
) -> list[str]:
    return python_module_args(
        "harness.cli",
        command,
        str(config_path),
        "--arm", spec.arm,
        "--seed", str(spec.seed),
        "--lag", str(spec.lag),
        "--mode", spec.mode,
        "--out", str(paths.root),
        "--steps", str(steps),
    )  # fmt: skip


def under_torchrun(args: list[str], ranks: int) -> list[str]:
    """`python -m harness.cli learner ...` as `ranks` torchrun processes on this machine (as is
    for one rank). `--standalone`: a rendezvous on a free local port, so trials running side
    by side never share one."""
    if ranks == 1:
        return args
    python, *module_args = args
    torchrun = [python, "-m", "torch.distributed.run", "--standalone"]
    return [*torchrun, "--nproc_per_node", str(ranks), *module_args]


def storage_step(what: str, step: Callable[..., None], *args: object) -> None:
    """A sync with the bucket; an unreachable store fails the trial in one line (resumable)."""
    try:
        step(*args)
    except OSError as exc:
        raise TrialFailedError(f"cannot {what} (output_dir is a URI): {exc}") from None


@dataclass(frozen=True)
class Launch:
    """What the supervisor needs to start a trial's components."""

    cfg: ExperimentConfig
    spec: TrialSpec
    paths: TrialPaths
    redis_url: str
    run_id: str
    steps: int
    resume: bool
    launcher: ComponentLauncher = field(default_factory=LocalLauncher)  # where components run
    sync: SupervisorSync = field(default_factory=SupervisorSync.none)  # output in a bucket
    # How the embedded Redis ended, once it did on its own (EmbeddedRedis.exit_reason); an
    # external Redis is not ours to watch: the components notice it is gone.
    redis_exit: Callable[[], str | None] = field(default=lambda: None)


def supervise(launch: Launch, interrupted: SignalLatch) -> TrialOutcome:
    cfg, spec, paths, steps = launch.cfg, launch.spec, launch.paths, launch.steps
    redis_url, run_id, resume = launch.redis_url, launch.run_id, launch.resume
    config_path = paths.resolved_config
    env = {"HARNESS_REDIS_URL": redis_url, "HARNESS_RUN_ID": run_id, **launch.sync.component_env()}
    for warning in thread_warnings(cfg, spec.arm):  # executor.cpu_sets smaller than threads
        print(f"warning: {warning}", flush=True)
    learner_args = under_torchrun(
        component_args("learner", config_path, spec, paths, steps), cfg.executor.learner_ranks
    )
    learner = launch.launcher.child("learner", learner_args + (["--resume"] if resume else []),
                    paths.component_log("learner"), env)  # fmt: skip
    generators = [
        launch.launcher.child(
            f"generator-{i}",
            [
                *component_args("generator", config_path, spec, paths, steps),
                *("--id", generator_id(i)),
            ],
            paths.component_log(f"generator-{i}"),
            env,
        )
        for i in range(cfg.generation.num_generators)
    ]
    children = [learner, *generators]
    outcome: TrialOutcome | None = None
    try:
        for child in children:
            child.start()
        outcome = _watch(launch, learner, generators, interrupted)
        return outcome
    finally:
        redis_gone = outcome is not None and outcome.redis_gone
        if not redis_gone:  # else nothing can read the flag, and a connect would only wait
            _stop_generators(redis_url, cfg, run_id)
        for child in reversed(children):
            child.stop(REDIS_GONE_GRACE_S if redis_gone else COMPONENT_GRACE_S)


def _watch(
    launch: Launch, learner: Component, generators: list[Component], interrupted: SignalLatch
) -> TrialOutcome:
    paths = launch.paths
    budgets = {gen.name: RestartBudget(MAX_GENERATOR_RESTARTS) for gen in generators}
    while True:
        if interrupted.caught:
            reason = "interrupted; resume with --resume"
            return TrialOutcome(TrialStatus.FAILED, steps_done(paths), reason)
        launch.sync.tick()
        code = learner.poll()
        if code is not None:
            storage_step("fetch the learner's outcome", launch.sync.learner_exited)
            return _learner_finished(code, learner, paths)
        died = launch.redis_exit()
        if died is not None:  # within a poll, not after every component's reconnect attempts
            return TrialOutcome(
                TrialStatus.FAILED, steps_done(paths), _redis_died(died, paths), True
            )
        for index, gen in enumerate(generators):
            gen_code = gen.poll()
            if gen_code is None or gen_code == 0:
                continue
            if gen_code == EXIT_NO_RESTART:
                reason = f"{gen.name} failed: {gen.last_line().removeprefix('error: ')}"
                return TrialOutcome(TrialStatus.FAILED, steps_done(paths), reason)
            if not budgets[gen.name].spend(_after_generator_crash(launch, generator_id(index))):
                return TrialOutcome(
                    TrialStatus.FAILED,
                    steps_done(paths),
                    f"{gen.name} crashed {MAX_GENERATOR_RESTARTS + 1} times in a row with no "
                    f"progress (no learner step, no group pushed), last with exit code "
                    f"{gen_code}: {gen.last_line() or 'no output'} (its log: "
                    f"{paths.component_log(gen.name)})",
                )
            gen.start()
        time.sleep(POLL_S)


def generator_id(index: int) -> str:
    """The id generator `index` of a trial runs under, kept across its restarts."""
    return f"gen-{index}"


def _after_generator_crash(launch: Launch, gen_id: str) -> int:
    """Expire the dead generator's leases (tickets, eval requests), so its restart (same id) or
    any other generator takes its work now rather than after DEFAULT_LEASE_S; returns the
    trial's progress, learner steps plus tickets completed, which grows with any learner step
    or pushed group."""
    completed = 0
    try:
        with connect(launch.redis_url, launch.cfg.buffer.tls_ca_file) as client:
            tickets = TicketDispenser(client, launch.run_id)
            tickets.release_owned(gen_id)
            EvalRequests(client, launch.run_id).release_owned(gen_id)
            completed = tickets.completed()
    except (OSError, redis.RedisError) as exc:  # Redis down: the learner reports it; count steps
        print(f"warning: cannot reach Redis after {gen_id} crashed: {exc}", flush=True)
    return steps_done(launch.paths) + completed


def _learner_finished(code: int, learner: Component, paths: TrialPaths) -> TrialOutcome:
    outcome = read_json(paths.learner_outcome)
    if code == 0 and outcome is not None:
        return TrialOutcome(
            TrialStatus(outcome["status"]), outcome["steps_completed"], outcome["diverged_reason"]
        )
    line = learner.last_line()
    if line.startswith("error: "):  # a one-line error the learner explained (lost Redis, ...)
        error = line.removeprefix("error: ")
        gone = error.startswith("Redis at ") and " is gone (" in error
        return TrialOutcome(TrialStatus.FAILED, steps_done(paths), f"learner failed: {error}", gone)
    last = f"last log line: {line or '(none)'} ({paths.component_log('learner')})"
    if low_on_space(paths.root):  # its error line may not even have reached its log
        crash = f"the learner exited with code {code}; {last}"
        return TrialOutcome(
            TrialStatus.FAILED, steps_done(paths), disk_full_line(paths.root, crash)
        )
    reason = f"learner exited with code {code}; resume with --resume; {last}"
    return TrialOutcome(TrialStatus.FAILED, steps_done(paths), reason)


def _redis_died(how: str, paths: TrialPaths) -> str:
    """The failure reason of a trial whose embedded Redis exited under it."""
    if low_on_space(paths.redis_dir):  # it exits when it cannot write its AOF under `always`
        return disk_full_line(paths.redis_dir, f"the trial's Redis stopped: {how}")
    return (
        f"the trial's Redis died: {how}; rerun the trial with --resume (the run's state survives "
        "in its AOF with buffer.appendfsync everysec or always)"
    )


def steps_done(paths: TrialPaths) -> int:
    """The last step the learner logged (0 before its first)."""
    steps = MetricsLog(paths.root).steps()
    return max(steps) if steps else 0


def _stop_generators(redis_url: str, cfg: ExperimentConfig, run_id: str) -> None:
    with contextlib.suppress(Exception), connect(redis_url, cfg.buffer.tls_ca_file) as client:
        request_stop(client, run_id)
