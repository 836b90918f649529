"""`harness trial`: run one (arm, seed, lag, mode) trial end to end and supervise its processes.

The runner prepares the trial directory (resolved config, prompt set, digests, metadata:
`prepare`), starts the embedded Redis when no URL is configured, then the learner and the
generator(s) where the executor puts them (`harness.executors`), sharing nothing but Redis and
the weight store (design section 3); `watch` restarts crashed generators and judges the outcome.
On SIGINT/SIGTERM every child is torn down before returning; the outcome is written to
trial.json (and synced to the bucket when output_dir is a URI).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import redis

from buffer.connection import BufferConnectionError, RunStateLostError
from buffer.eval_requests import EvalRequests
from buffer.server import EmbeddedRedis, RedisStartError
from buffer.streams import TicketDispenser, VersionRegistry, clear_stop, connect, delete_run
from contract.layout import TrialPaths
from contract.record import (
    TrialRecord,
    TrialRecordError,
    read_trial_record,
    rewrite_trial_record_in_place,
    write_trial_record,
)
from contract.trial import TrialSpec, TrialStatus
from harness.config import ConfigError, ExperimentConfig
from harness.executors import open_executor
from harness.executors.base import TrialFailedError
from harness.file_lock import LockTimeoutError, file_lock
from harness.signals import SignalLatch, forward_signals
from harness.storage.setup import setup_supervisor_sync
from harness.trial.disk_space import disk_full_line, first_line, is_disk_full
from harness.trial.prepare import prepare_trial, run_id_for
from harness.trial.watch import Launch, TrialOutcome, steps_done, storage_step, supervise

# A previous supervisor of the same trial tears down in about component grace (10 s) + Redis stop.
SUPERVISOR_LOCK_WAIT_S = 30.0


@contextlib.contextmanager
def redis_for_trial(
    cfg: ExperimentConfig, paths: TrialPaths, host: str = "127.0.0.1"
) -> Iterator[tuple[str, Callable[[], str | None]]]:
    """The configured Redis URL, or an embedded redis-server whose AOF lives in the trial dir,
    bound to `host` (loopback, or the node's address when components run on other nodes); with
    how that server ended once it did on its own (None while it runs, or for an external one).
    """
    if cfg.buffer.redis_url:
        yield cfg.buffer.redis_url, lambda: None
        return
    paths.redis_dir.mkdir(parents=True, exist_ok=True)  # EmbeddedRedis makes it 0700
    with EmbeddedRedis(paths.redis_dir, appendfsync=cfg.buffer.appendfsync, host=host) as server:
        yield server.url, server.exit_reason


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


# What ends an attempt with a one-line reason rather than a traceback (a bug raises anything
# else; its attempt is still recorded `failed` before the traceback).
_ONE_LINE_FAILURES = (
    TrialFailedError,
    ConfigError,
    RedisStartError,
    BufferConnectionError,
    RunStateLostError,
    redis.RedisError,
    OSError,
)


def _run_trial(
    cfg: ExperimentConfig, spec: TrialSpec, paths: TrialPaths, steps: int, resume: bool
) -> TrialOutcome:
    """Prepare, supervise and record one attempt. Whatever ends it after it began, trial.json
    says `failed` with that attempt's reason on one line (a Redis that cannot load its AOF, a
    full disk, a Redis gone), never `running` or an earlier attempt's reason."""
    try:
        record = prepare_trial(cfg, spec, paths, steps, resume)
    except OSError as exc:  # a full disk, say: the record on disk is an earlier attempt's
        ending = _Ending(paths, _previous_record(paths))
        return ending.record(_failed(paths, exc, "preparing the trial"))
    ending = _Ending(paths, record)
    try:
        return _supervise_trial(cfg, spec, paths, steps, resume, ending=ending)
    except _ONE_LINE_FAILURES as exc:
        return ending.record(_failed(paths, exc, "supervising the trial"))
    except BaseException as exc:
        ending.record(_failed(paths, exc, "the supervisor crashed"))
        raise


def _supervise_trial(
    cfg: ExperimentConfig,
    spec: TrialSpec,
    paths: TrialPaths,
    steps: int,
    resume: bool,
    *,
    ending: _Ending,
) -> TrialOutcome:
    run_id = run_id_for(cfg, spec)
    interrupted = SignalLatch()
    executor = open_executor(cfg.executor)
    sync = setup_supervisor_sync(paths.root, executor)
    storage_step("upload the trial's inputs", sync.prepared, resume)
    components = executor.components(cfg.generation.num_generators, interrupted)
    with components as launcher:  # before our handlers: Ray installs its own
        try:
            with (
                forward_signals(interrupted.set),
                redis_for_trial(cfg, paths, launcher.redis_host) as (redis_url, redis_exit),
            ):
                _reset_run(redis_url, cfg, run_id, fresh=not resume, weights=paths.weights)
                launch = Launch(
                    cfg, spec, paths, redis_url, run_id, steps, resume, launcher, sync, redis_exit
                )
                outcome = supervise(launch, interrupted)
        except _ONE_LINE_FAILURES as exc:  # Redis would not start, or died under _reset_run
            outcome = _failed(paths, exc, "starting the trial")
        # Recorded (and synced, Redis' AOF complete) before the launcher lets go of Ray: a
        # private Ray instance dies with a killed `harness run`, and Ray's teardown then waits
        # for its GCS until Ray ends this process (60 s); the record must not wait for that.
        ending.record(outcome)
        try:
            sync.finished()
        except OSError as exc:  # the outcome stands; `harness run` pushes the record again
            print(f"warning: cannot sync the finished trial to the bucket: {exc}", flush=True)
    return outcome


def _failed(paths: TrialPaths, exc: BaseException, doing: str) -> TrialOutcome:
    """A failed outcome whose reason is `exc` on one line (a full disk says so)."""
    if isinstance(exc, TrialFailedError | ConfigError | RedisStartError | BufferConnectionError):
        reason = " ".join(str(exc).split())  # written as one line already; keep it whole
    elif is_disk_full(exc, paths.root):
        reason = disk_full_line(paths.root, f"{doing}: {first_line(exc)}")
    else:
        reason = f"{doing}: {first_line(exc)}"
    return TrialOutcome(TrialStatus.FAILED, steps_done(paths), reason)


class _Ending:
    """Writes an attempt's outcome into trial.json once (the first outcome stands), even on a
    full disk: the atomic write needs a new file, so it falls back to rewriting the record in
    place, in the blocks it already has."""

    def __init__(self, paths: TrialPaths, record: TrialRecord | None) -> None:
        self._paths, self._record = paths, record
        self._outcome: TrialOutcome | None = None

    def record(self, outcome: TrialOutcome) -> TrialOutcome:
        if self._outcome is not None:
            return self._outcome
        self._outcome = outcome
        if self._record is None:  # nothing recorded yet: nothing claims `running` either
            return outcome
        finished = self._record.model_copy(update=_finished_fields(outcome))
        try:
            write_trial_record(self._paths.root, finished)
        except OSError as exc:
            try:
                rewrite_trial_record_in_place(self._paths.root, finished)
            except OSError:
                print(f"warning: cannot record the outcome in trial.json: {exc}", flush=True)
        return outcome


def _previous_record(paths: TrialPaths) -> TrialRecord | None:
    try:
        return read_trial_record(paths.root)
    except TrialRecordError:
        return None


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


def _reset_run(
    redis_url: str, cfg: ExperimentConfig, run_id: str, fresh: bool, weights: Path
) -> None:
    """Fresh trial: delete the run's keys (a previous attempt's leftovers). Resume: release the
    tickets and eval requests leased by the generators that died with the previous attempt,
    and name again the location of every version in the weight store `weights` whose location
    Redis lost (an AOF cut short: the generators start before the learner could). Either way
    withdraw the stop flag the previous attempt's teardown set, or every generator would exit
    at once."""
    with connect(redis_url, cfg.buffer.tls_ca_file) as client:
        if fresh:
            delete_run(client, run_id)  # the learner's consumer creates the stream's group again
        else:
            from buffer.weight_store import WeightStore  # torch: only a resume reads the store

            TicketDispenser(client, run_id).expire_all_leases()
            EvalRequests(client, run_id).expire_all_leases()
            store = WeightStore(weights)
            VersionRegistry(client, run_id).restore_locations(
                {v: store.path(v) for v in store.versions()}
            )
        clear_stop(client, run_id)


__all__ = ["TrialFailedError", "TrialOutcome", "run_trial"]
