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
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from buffer.server import EmbeddedRedis
from buffer.streams import RolloutBuffer, TicketDispenser, connect
from contract.layout import TrialPaths
from contract.record import write_trial_record
from contract.trial import TrialSpec, TrialStatus
from harness.config import ExperimentConfig
from harness.executors import open_executor
from harness.executors.base import TrialFailedError
from harness.file_lock import LockTimeoutError, file_lock
from harness.signals import SignalLatch, forward_signals
from harness.storage.setup import setup_supervisor_sync
from harness.trial.prepare import prepare_trial, run_id_for
from harness.trial.watch import Launch, TrialOutcome, storage_step, supervise

# A previous supervisor of the same trial tears down in about component grace (10 s) + Redis stop.
SUPERVISOR_LOCK_WAIT_S = 30.0


@contextlib.contextmanager
def redis_for_trial(
    cfg: ExperimentConfig, paths: TrialPaths, host: str = "127.0.0.1"
) -> Iterator[str]:
    """The configured Redis URL, or an embedded redis-server whose AOF lives in the trial dir,
    bound to `host` (loopback, or the node's address when components run on other nodes)."""
    if cfg.buffer.redis_url:
        yield cfg.buffer.redis_url
        return
    paths.redis_dir.mkdir(parents=True, exist_ok=True)  # EmbeddedRedis makes it 0700
    with EmbeddedRedis(paths.redis_dir, appendfsync=cfg.buffer.appendfsync, host=host) as server:
        yield server.url


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
    executor = open_executor(cfg.executor)
    sync = setup_supervisor_sync(paths.root, executor)
    storage_step("upload the trial's inputs", sync.prepared, resume)
    components = executor.components(cfg.generation.num_generators, interrupted)
    with components as launcher:  # before our handlers: Ray installs its own
        with (
            forward_signals(interrupted.set),
            redis_for_trial(cfg, paths, launcher.redis_host) as redis_url,
        ):
            _reset_run(redis_url, cfg, run_id, fresh=not resume)
            launch = Launch(cfg, spec, paths, redis_url, run_id, steps, resume, launcher, sync)
            outcome = supervise(launch, interrupted)
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


def _reset_run(redis_url: str, cfg: ExperimentConfig, run_id: str, fresh: bool) -> None:
    """Fresh trial: delete the run's keys (a previous attempt's leftovers). Resume: release the
    tickets leased by the generators that died with the previous attempt. Either way withdraw the
    stop flag the previous attempt's teardown set, or every generator would exit at once."""
    with connect(redis_url, cfg.buffer.tls_ca_file) as client:
        tickets = TicketDispenser(client, run_id)
        if fresh:
            RolloutBuffer(client, run_id, cfg.buffer).delete_run()
        else:
            tickets.expire_all_leases()
        tickets.clear_stop()


__all__ = ["TrialFailedError", "TrialOutcome", "run_trial"]
