"""`harness trial`: run one (arm, seed, lag, mode) trial end to end and supervise its processes.

The runner prepares the trial directory (resolved config, prompt set, digests, metadata), starts
the embedded Redis when no URL is configured, then the learner and the generator(s) as separate
processes sharing nothing but Redis and the weight store (design section 3). It restarts a
crashed generator under its old id, first expiring the leases of the tickets it held (the process
holding them is dead), so the trial goes on at once instead of after the lease. Restarts are
budgeted per unit of progress (processes.RestartBudget): MAX_GENERATOR_RESTARTS crashes of one
generator in a row with no learner step and no group pushed in between fail the trial; any
progress renews the budget. A generator exiting with EXIT_NO_RESTART (an error a restart cannot
fix) fails the trial at once with its one-line reason. A learner crash fails the trial
(resumably), and on SIGINT/SIGTERM every child is torn down before returning.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import redis
import yaml

from contract.layout import TrialPaths
from contract.record import (
    TrialRecord,
    TrialRecordError,
    read_json,
    read_trial_record,
    write_trial_record,
)
from contract.trial import TERMINAL_STATUSES, TrialSpec, TrialStatus
from harness.config import ExperimentConfig
from harness.file_lock import LockTimeoutError, file_lock
from harness.models.factory import build_model_dir, load_tokenizer, weights_digest
from harness.provenance import file_digest, provenance
from harness.signals import SignalLatch, forward_signals
from harness.storage.trial_storage import SupervisorSync
from harness.tasks.factory import make_rendered_task
from harness.tasks.mixture import make_train_mixture
from harness.trial.launchers import Component, ComponentLauncher, LocalLauncher, open_launcher
from harness.trial.processes import (
    EXIT_NO_RESTART,
    RestartBudget,
    python_module_args,
)

# Restarts of one generator in a row without progress (a learner step or a pushed group).
MAX_GENERATOR_RESTARTS = 3
# A previous supervisor of the same trial tears down in about component grace (10 s) + Redis stop.
SUPERVISOR_LOCK_WAIT_S = 30.0
POLL_S = 0.2


class TrialFailedError(RuntimeError):
    """The learner crashed or could not start; the trial is resumable with --resume."""


@dataclass
class TrialOutcome:
    status: TrialStatus  # completed | diverged | failed
    steps_completed: int
    reason: str | None = None


def run_id_for(cfg: ExperimentConfig, spec: TrialSpec) -> str:
    """Redis namespace of a trial: many trials (and experiments) may share one Redis."""
    return f"{cfg.name}.{cfg.config_hash()}.{spec.name}"


def prompt_table(
    cfg: ExperimentConfig, spec: TrialSpec, steps: int, model_dir: Path
) -> pd.DataFrame:
    """The exact prompts the trial trains and evaluates on; equal tables prove matched arms.

    `prompt` is the rendered text (chat template applied, `task.prompt_format`) that the model
    is given, so the prompt-set digest changes when the rendering does. `task` names where a row
    came from: the training mixture's component (task.name without `train_tasks`), or the eval
    set (`heldout` without `evals`).
    """
    tokenizer = load_tokenizer(model_dir)
    mixture = make_train_mixture(cfg, tokenizer)
    n_train = steps * cfg.learner.prompts_per_step
    rows = []
    for i in range(n_train):
        component, p = mixture.prompt(spec.seed, i)
        rows.append(("train", component.name, p.index, p.text, p.ground_truth))
    for name, task_cfg in cfg.eval_sets():
        evals = make_rendered_task(task_cfg, tokenizer).eval_prompts(task_cfg.eval_size)
        rows += [("eval", name, p.index, p.text, p.ground_truth) for p in evals]
    return pd.DataFrame(rows, columns=["split", "task", "index", "prompt", "ground_truth"])


def prepare_trial(
    cfg: ExperimentConfig, spec: TrialSpec, paths: TrialPaths, steps: int, resume: bool
) -> TrialRecord:
    """Write resolved config, prompt set and the trial record; returns the record."""
    paths.root.mkdir(parents=True, exist_ok=True)
    previous = _previous_record(paths)
    if previous and previous.status in TERMINAL_STATUSES and not resume:
        raise TrialFailedError(
            f"trial {spec.name} already finished ({previous.status.value}) in {paths.root}"
        )
    if not resume:
        for stale in (
            paths.checkpoints,
            paths.metrics,
            paths.evals,
            paths.weights,
            paths.redis_dir,
        ):
            _remove_tree(stale)
        paths.learner_outcome.unlink(missing_ok=True)
    paths.resolved_config.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    model_dir = build_model_dir(cfg.model, cfg.task)
    prompt_table(cfg, spec, steps, model_dir).to_parquet(paths.prompts, index=False)
    arm = cfg.arm(spec.arm)
    record = TrialRecord(
        experiment=cfg.name,
        trial_name=spec.name,
        arm=spec.arm,
        objective=arm.objective,
        seed=spec.seed,
        lag=spec.lag,
        mode=spec.mode,
        status=TrialStatus.RUNNING,
        diverged=False,
        diverged_reason=None,
        failure_reason=None,
        steps_planned=steps,
        steps_completed=0,
        config_hash=cfg.config_hash(),
        initial_weights_digest=weights_digest(model_dir),
        prompt_set_digest=file_digest(paths.prompts),
        model_dir=str(model_dir),
        started_at=(previous and previous.started_at) or datetime.now(UTC).isoformat(),
        finished_at=None,
        resumed=resume,
        provenance=provenance(),
    )
    write_trial_record(paths.root, record)
    return record


def _previous_record(paths: TrialPaths) -> TrialRecord | None:
    """The record an earlier attempt left, if valid. An invalid one (hand-edited, truncated) is
    replaced: `harness run` resumes such trials, and the checkpoints tell where to go on."""
    try:
        return read_trial_record(paths.root)
    except TrialRecordError as exc:
        print(f"warning: {exc}; writing a new record", flush=True)
        return None


def _remove_tree(path: Path) -> None:
    import shutil

    if path.exists():
        shutil.rmtree(path)


@contextlib.contextmanager
def redis_for_trial(
    cfg: ExperimentConfig, paths: TrialPaths, host: str = "127.0.0.1"
) -> Iterator[str]:
    """The configured Redis URL, or an embedded redis-server whose AOF lives in the trial dir,
    bound to `host` (loopback, or the node's address when components run on other nodes)."""
    if cfg.buffer.redis_url:
        yield cfg.buffer.redis_url
        return
    from buffer.server import EmbeddedRedis

    paths.redis_dir.mkdir(parents=True, exist_ok=True)  # EmbeddedRedis makes it 0700
    with EmbeddedRedis(paths.redis_dir, appendfsync=cfg.buffer.appendfsync, host=host) as server:
        yield server.url


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


def run_trial(
    cfg: ExperimentConfig,
    spec: TrialSpec,
    out_dir: Path,
    steps: int | None = None,
    resume: bool = False,
) -> TrialOutcome:
    """Run a trial to its end; the returned status is also written to trial.json.

    One supervisor per trial directory: a second one (a re-run racing the teardown of a killed
    `harness run`, or a hand-started `harness trial`) waits for the first to let go, then fails
    naming the lock instead of sharing its Redis, logs and checkpoints.
    """
    paths = TrialPaths(Path(out_dir))
    paths.root.mkdir(parents=True, exist_ok=True)
    holder = f"another supervisor of trial {spec.name} (a `harness run` or `harness trial`)"
    try:
        with file_lock(paths.supervisor_lock, SUPERVISOR_LOCK_WAIT_S, holder):
            return _run_trial(cfg, spec, paths, steps or cfg.learner.steps, resume)
    except LockTimeoutError as exc:
        raise TrialFailedError(str(exc)) from None


def _run_trial(
    cfg: ExperimentConfig, spec: TrialSpec, paths: TrialPaths, steps: int, resume: bool
) -> TrialOutcome:
    record = prepare_trial(cfg, spec, paths, steps, resume)
    run_id = run_id_for(cfg, spec)
    interrupted = SignalLatch()
    sync = SupervisorSync.for_trial(paths.root, private_components=cfg.executor.kind == "ray")
    _storage_step("upload the trial's inputs", sync.prepared, resume)
    with open_launcher(cfg, interrupted) as launcher:  # before our handlers: Ray installs its own
        with (
            forward_signals(interrupted.set),
            redis_for_trial(cfg, paths, launcher.redis_host) as redis_url,
        ):
            _reset_run(redis_url, cfg, run_id, fresh=not resume)
            launch = Launch(cfg, spec, paths, redis_url, run_id, steps, resume, launcher, sync)
            outcome = _supervise(launch, interrupted)
        # Recorded (and synced, Redis' AOF complete) before the launcher lets go of Ray: a
        # private Ray instance dies with a killed `harness run`, and Ray's teardown then waits
        # for its GCS until Ray ends this process (60 s); the record must not wait for that.
        write_trial_record(paths.root, record.model_copy(update=_finished_fields(outcome)))
        try:
            sync.finished()
        except OSError as exc:  # the outcome stands; `harness run` pushes the record again
            print(f"warning: cannot sync the finished trial to the bucket: {exc}", flush=True)
    return outcome


def _finished_fields(outcome: TrialOutcome) -> dict[str, object]:
    diverged, failed = outcome.status == TrialStatus.DIVERGED, outcome.status == TrialStatus.FAILED
    return {
        "status": outcome.status,
        "steps_completed": outcome.steps_completed,
        "diverged": diverged,
        "diverged_reason": outcome.reason if diverged else None,
        "failure_reason": outcome.reason if failed else None,
        "finished_at": datetime.now(UTC).isoformat(),
    }


def _storage_step(what: str, step: Callable[..., None], *args: object) -> None:
    """A sync with the bucket; an unreachable store fails the trial in one line (resumable)."""
    try:
        step(*args)
    except OSError as exc:
        raise TrialFailedError(f"cannot {what} (output_dir is a URI): {exc}") from None


def _reset_run(redis_url: str, cfg: ExperimentConfig, run_id: str, fresh: bool) -> None:
    """Fresh trial: delete the run's keys (a previous attempt's leftovers). Resume: release the
    tickets leased by the generators that died with the previous attempt. Either way withdraw the
    stop flag the previous attempt's teardown set, or every generator would exit at once."""
    from buffer.streams import RolloutBuffer, TicketDispenser, connect

    with connect(redis_url, cfg.buffer.tls_ca_file) as client:
        tickets = TicketDispenser(client, run_id)
        if fresh:
            RolloutBuffer(client, run_id, cfg.buffer).delete_run()
        else:
            tickets.expire_all_leases()
        tickets.clear_stop()


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


def _supervise(launch: Launch, interrupted: SignalLatch) -> TrialOutcome:
    cfg, spec, paths, steps = launch.cfg, launch.spec, launch.paths, launch.steps
    redis_url, run_id, resume = launch.redis_url, launch.run_id, launch.resume
    config_path = paths.resolved_config
    env = {"HARNESS_REDIS_URL": redis_url, "HARNESS_RUN_ID": run_id, **launch.sync.component_env()}
    learner_args = component_args("learner", config_path, spec, paths, steps)
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
    try:
        for child in children:
            child.start()
        return _watch(launch, learner, generators, interrupted)
    finally:
        _stop_generators(redis_url, cfg, run_id)
        for child in reversed(children):
            child.stop()


def _watch(
    launch: Launch, learner: Component, generators: list[Component], interrupted: SignalLatch
) -> TrialOutcome:
    paths = launch.paths
    budgets = {gen.name: RestartBudget(MAX_GENERATOR_RESTARTS) for gen in generators}
    while True:
        if interrupted.caught:
            reason = "interrupted; resume with --resume"
            return TrialOutcome(TrialStatus.FAILED, _steps_done(paths), reason)
        launch.sync.tick()
        code = learner.poll()
        if code is not None:
            _storage_step("fetch the learner's outcome", launch.sync.learner_exited)
            return _learner_finished(code, learner, paths)
        for index, gen in enumerate(generators):
            gen_code = gen.poll()
            if gen_code is None or gen_code == 0:
                continue
            if gen_code == EXIT_NO_RESTART:
                reason = f"{gen.name} failed: {gen.last_line().removeprefix('error: ')}"
                return TrialOutcome(TrialStatus.FAILED, _steps_done(paths), reason)
            if not budgets[gen.name].spend(_after_generator_crash(launch, generator_id(index))):
                return TrialOutcome(
                    TrialStatus.FAILED,
                    _steps_done(paths),
                    f"{gen.name} crashed {MAX_GENERATOR_RESTARTS + 1} times in a row with no "
                    f"progress (no learner step, no group pushed); last log lines:\n{gen.tail()}",
                )
            gen.start()
        time.sleep(POLL_S)


def generator_id(index: int) -> str:
    """The id generator `index` of a trial runs under, kept across its restarts."""
    return f"gen-{index}"


def _after_generator_crash(launch: Launch, gen_id: str) -> int:
    """Expire the dead generator's leases, so its restart (same id) or any other generator takes
    its tickets now rather than after DEFAULT_LEASE_S; returns the trial's progress, learner
    steps plus tickets completed, which grows with any learner step or pushed group."""
    from buffer.streams import TicketDispenser, connect

    completed = 0
    try:
        with connect(launch.redis_url, launch.cfg.buffer.tls_ca_file) as client:
            tickets = TicketDispenser(client, launch.run_id)
            tickets.release_owned(gen_id)
            completed = tickets.completed()
    except (OSError, redis.RedisError) as exc:  # Redis down: the learner reports it; count steps
        print(f"warning: cannot reach Redis after {gen_id} crashed: {exc}", flush=True)
    return _steps_done(launch.paths) + completed


def _learner_finished(code: int, learner: Component, paths: TrialPaths) -> TrialOutcome:
    outcome = read_json(paths.learner_outcome)
    if code == 0 and outcome is not None:
        return TrialOutcome(
            TrialStatus(outcome["status"]), outcome["steps_completed"], outcome["diverged_reason"]
        )
    line = learner.last_line()
    if line.startswith("error: "):  # a one-line error the learner explained (lost Redis, ...)
        return TrialOutcome(
            TrialStatus.FAILED,
            _steps_done(paths),
            f"learner failed: {line.removeprefix('error: ')}",
        )
    return TrialOutcome(
        TrialStatus.FAILED,
        _steps_done(paths),
        f"learner exited with code {code}; resume with --resume. Last log lines:\n{learner.tail()}",
    )


def _steps_done(paths: TrialPaths) -> int:
    from learner.metrics_log import MetricsLog

    steps = MetricsLog(paths.root).steps()
    return max(steps) if steps else 0


def _stop_generators(redis_url: str, cfg: ExperimentConfig, run_id: str) -> None:
    from buffer.streams import RolloutBuffer, connect

    with contextlib.suppress(Exception), connect(redis_url, cfg.buffer.tls_ca_file) as client:
        RolloutBuffer(client, run_id, cfg.buffer).request_stop()


__all__ = ["TrialFailedError", "TrialOutcome", "run_trial"]
