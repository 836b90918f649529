"""The learner's training loop, a recipe read top to bottom: take a batch, train, publish the
weights, record the step, commit at checkpoints, over components it imports.

A step k (0-based) trains on batch k and produces policy version k + 1. The step is *published*
as soon as its weights are in the weight store and the version registry names them (generators
may use it: `learner.runtime.published`), and *committed* at a checkpoint: the checkpoint is
written first, then the groups consumed since the previous checkpoint are marked trained and
acknowledged in Redis (`learner.runtime.resume`, which also says how a killed learner resumes).
Taking (`learner.runtime.take`) checks every group at intake and never trains one twice; the
step's metric row is assembled in `learner.runtime.step_metrics` and written with its ledger by
`learner.runtime.records`, off the critical path (`learner.runtime.step_io`).

Evals are the generators' (`buffer.eval_requests`): after publishing a version whose evals are
due, the learner asks for them, and the step's records wait for the answer on their own writer
thread while training goes on; a checkpoint waits for them like for any record it vouches for.

Data-parallel (`torchrun`, `learner.runtime.distributed`): rank 0 alone takes, publishes, asks
for evals, logs and commits; it broadcasts each batch, which keeps the other ranks in lockstep,
and every rank trains its share of it and loads the checkpoint on resume. Sharded
(`learner.parallel=fsdp`), every rank also takes part in gathering each version's full weights
(`PublishedWeights`) and in writing each checkpoint's shards; the collectives run in the same
order on every rank: batch broadcast, training, gather, checkpoint.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import NamedTuple

import numpy as np
import torch

from buffer.collate import collate
from buffer.intake import model_limits
from buffer.streams import SlotRefusedError
from contract import metrics as M
from contract.trial import TrialStatus
from learner.runtime.checkpoint import TrainingState
from learner.runtime.distributed import SINGLE, DistContext, broadcast_batch
from learner.runtime.models import build_step_models, wrap_ddp
from learner.runtime.published import PublishedWeights
from learner.runtime.records import LoggedRollouts, StepRecords, rollouts_to_log
from learner.runtime.resume import Commits, Start, start_or_resume
from learner.runtime.step import (
    DivergenceError,
    StepModels,
    StepResult,
    check_group_split,
    train_on_batch,
)
from learner.runtime.step_io import StepWriter
from learner.runtime.step_metrics import grad_spikes, ledger_rows, perf_metrics, step_metrics
from learner.runtime.take import NOTHING, BatchTaker, Taken
from learner.runtime.task import EvalPort, LearnerOutcome, LearnerPorts, LearnerTask

__all__ = [
    "LearnerOutcome",
    "LearnerPorts",
    "LearnerTask",
    "configure_determinism",
    "run_learner",
]


def run_learner(
    task: LearnerTask,
    ports: LearnerPorts,
    *,
    resume: bool = False,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    dist: DistContext = SINGLE,
) -> LearnerOutcome:
    """Train `task.total_steps` steps; returns how the run ended (raises on infrastructure)."""
    cfg, total_steps = task.learner, task.total_steps
    check_group_split(cfg.prompts_per_step, cfg.minibatches, dist.world_size)
    configure_determinism(task.seed, cfg.threads)
    models = build_step_models(task.model_dir, task.arm, cfg, total_steps)
    train_models = wrap_ddp(models, dist)  # checkpoints and weight store use `models`
    start = start_or_resume(task, models, ports, resume=resume, dist=dist)
    state, published, records, commits = start.state, start.published, start.records, start.commits
    config = models.policy.module.config
    taker = _batch_taker(task, ports, config, start)
    rewind_metrics = start.rewind.metrics() if start.rewind is not None else {}
    metrics: dict[str, float] = {}
    if state.refused_slots:  # a slot the checkpoint says can never fill: fail at once
        return _refused(state, metrics)
    checkpoint_s: float | None = None  # logged on the step after its checkpoint
    latest_eval: dict[str, float] = {}  # the newest recorded eval's metrics (`_record_step`)
    # Off the critical path, on two writers: weights (publish, then the eval request) and the
    # step records (which wait for the step's evals, run by a generator, when they are due).
    with StepWriter() as step_io, StepWriter("learner-records") as records_io:
        writers = (step_io, records_io)
        while state.step < total_steps:
            step, t_wait = state.step, time.perf_counter()
            if task.lag == 0 and dist.is_main:
                # Batch `step` is sampled by the version the previous step just handed to the
                # writer: nothing arrives before that write is done, so waiting costs nothing,
                # and a failed write (a full disk) ends the run now, not at the take's timeout.
                step_io.drain()
            try:  # take
                taken = taker.take(step) if dist.is_main else NOTHING
            except SlotRefusedError as exc:  # nothing can fill that slot: checkpoint why
                collective = published.sharded and dist.world_size > 1
                _checkpoint_refusal(exc, state, writers, commits, collective=collective)
                if dist.world_size > 1:
                    raise  # the other ranks wait in the batch broadcast: end them all
                return _refused(state, metrics)
            t_train = time.perf_counter()
            try:  # train
                result = _train(train_models, taken, task, step, dist=dist, pad_id=_pad_id(config))
            except DivergenceError as exc:
                # A divergence ends the trial; its groups stay pending (never marked trained).
                reason = f"step {step}: {exc}"
                return LearnerOutcome(TrialStatus.DIVERGED, state.step, reason, metrics)
            state.step = step + 1
            state.updates += cfg.ppo_epochs * cfg.minibatches
            t_publish = time.perf_counter()  # publish: snapshot now, write during the next step
            snapshot = published.snapshot()  # sharded: every rank gathers, rank 0 keeps it
            checkpoint_due = state.step % cfg.checkpoint_every == 0 or state.step == total_steps
            if not dist.is_main:
                if published.sharded and checkpoint_due:
                    commits.save_shards(state)
                continue  # rank 0 alone publishes, asks for evals, commits and logs
            eval_due = state.step % cfg.eval_every == 0 or state.step == total_steps
            eval_request = _submit_publish(
                step_io, published, ports.evals, snapshot, state, eval_due=eval_due
            )
            t_published = time.perf_counter()
            # Settled at the checkpoint: every group read, trained or filtered (dynamic
            # sampling), so none is read again; the checkpoint's "trained" ids are these.
            commits.add(taken.consumed)
            state.trained_group_ids = taker.settle(taken)
            metrics = step_metrics(taken, result.metrics, step)  # record
            metrics |= grad_spikes(state, metrics[M.OPTIM_GRAD_NORM], cfg.grad_spike_factor)
            metrics |= ports.telemetry.buffer_metrics() | ports.telemetry.generator_metrics()
            metrics |= perf_metrics(t_wait, t_train, t_publish, t_published, checkpoint_s)
            metrics |= rewind_metrics  # the first step after a rewinding resume
            metrics |= _withdrawn(taken)
            rewind_metrics = {}
            record = _step_record(task, taken, step, metrics)
            records_io.submit(
                partial(_record_step, records, ports.evals, record, eval_request, latest_eval)
            )
            checkpoint_s = _commit(writers, commits, state) if checkpoint_due else None
            if on_step is not None:
                on_step(state.step, metrics)
        records_io.drain()  # the last step is a checkpoint's: already drained, evals included
        return LearnerOutcome(TrialStatus.COMPLETED, state.step, None, metrics | latest_eval)


def configure_determinism(seed: int, threads: int) -> None:
    """Seed everything and pin threads: fixed-mode CPU runs are bitwise reproducible."""
    # torch._C.set_num_threads works even where an in-process engine made set_num_threads a no-op.
    torch._C.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))  # noqa: NPY002 - seed the global RNG libraries draw from
    random.seed(seed)


def _batch_taker(
    task: LearnerTask, ports: LearnerPorts, config: object, start: Start
) -> BatchTaker:
    """Rank 0's reader of the buffer, checking each group against the model's limits and
    skipping the groups the resumed checkpoint already trained."""
    return BatchTaker(
        ports.buffer,
        task,
        model_limits(config),
        trained=start.state.trained_group_ids,
        timeline=start.timeline,
    )


def _train(
    models: StepModels,
    taken: Taken,
    task: LearnerTask,
    step: int,
    *,
    dist: DistContext,
    pad_id: int,
) -> StepResult:
    """Collate rank 0's batch, hand it to every rank and train on it: the loop's one call of
    `train_on_batch` (raises DivergenceError on a non-finite loss or gradient)."""
    batch = collate([d.group for d in taken.trained], pad_id=pad_id) if dist.is_main else None
    batch = broadcast_batch(batch, dist)  # rank 0's batch on every rank
    return train_on_batch(
        models,
        batch,
        arm=task.arm,
        learner=task.learner,
        group_size=task.group_size,
        max_len=task.max_new_tokens,
        version=step,
        dist=dist,
        sampling=task.sampling,
    )


def _publish(
    published: PublishedWeights,
    evals: EvalPort,
    version: int,
    snapshot: dict[str, torch.Tensor],
    eval_request: Future[str] | None,
) -> None:
    """Publish `version` (the weight store keeps the versions whose evals are pending) and,
    when its evals are due, ask the generators for them: only now can one load its weights.
    The request's id goes to `_record_step` through `eval_request`, or the failure does."""
    try:
        published.publish(version, snapshot, protect=evals.pending_versions())
        if eval_request is not None:
            eval_request.set_result(evals.request(version))
    except BaseException as exc:
        if eval_request is not None and not eval_request.done():
            eval_request.set_exception(exc)
        raise


def _submit_publish(
    step_io: StepWriter,
    published: PublishedWeights,
    evals: EvalPort,
    snapshot: dict[str, torch.Tensor],
    state: TrainingState,
    *,
    eval_due: bool,
) -> Future[str] | None:
    """Hand version `state.step` to the weights writer (`_publish`); when its evals are due,
    the future that gets their request's id, for the step's record to wait on."""
    eval_request: Future[str] | None = Future() if eval_due else None
    step_io.submit(partial(_publish, published, evals, state.step, snapshot, eval_request))
    return eval_request


class _StepRecord(NamedTuple):
    """What one step leaves on disk (`StepRecords.append`), taken on the training thread: the
    policy version it made, when, its metric row (a copy), its ledger rows and, when the step
    is logged, its rollouts (decoded by the records writer)."""

    step: int
    timestamp: float
    metrics: dict[str, float]
    ledger: list[dict[str, object]]
    rollouts: LoggedRollouts | None


def _step_record(
    task: LearnerTask, taken: Taken, step: int, metrics: dict[str, float]
) -> _StepRecord:
    """The record of step `step` (0-based), which made version `step + 1`."""
    ledger = ledger_rows(taken, step)
    trained = [d.group for d in taken.trained]
    version, total_steps = step + 1, task.total_steps
    logged = rollouts_to_log(task.learner.rollout_log, version, total_steps, trained, task.decode)
    return _StepRecord(version, time.time(), dict(metrics), ledger, logged)


def _withdrawn(taken: Taken) -> dict[str, float]:
    """`rewind/withdrawn_groups` when the take dropped groups a rewind withdrew, else nothing."""
    return {M.REWIND_WITHDRAWN_GROUPS: float(len(taken.withdrawn))} if taken.withdrawn else {}


def _record_step(
    records: StepRecords,
    evals: EvalPort,
    record: _StepRecord,
    eval_request: Future[str] | None,
    latest_eval: dict[str, float],
) -> None:
    """Write the step's metric row (with eval/pass_rate and perf/eval_s when its evals were
    due: waited for here, off the training thread), its eval rows, its ledger and, when the
    step is logged, its rollouts (decoded here, off the training thread too)."""
    step, timestamp, metrics, ledger, rollouts = record
    if eval_request is not None:
        report, seconds = evals.wait(eval_request.result())
        scores = {M.EVAL_PASS_RATE: records.eval_pass_rate(step, report), M.PERF_EVAL_S: seconds}
        latest_eval.clear()
        latest_eval.update(scores)
        metrics = metrics | scores
    records.append(step, timestamp, metrics, ledger, rollouts)


def _commit(writers: tuple[StepWriter, ...], commits: Commits, state: TrainingState) -> float:
    """Checkpoint `state`, returning the seconds it took (`perf/checkpoint_s`, logged on the next
    step). A checkpoint claims steps <= this one: their weights, metric rows, evals and ledger
    must be on disk first (a resume truncates only what is newer), so the writers drain first."""
    t_checkpoint = time.perf_counter()
    for writer in writers:
        writer.drain()
    commits.commit(state)
    return time.perf_counter() - t_checkpoint


def _checkpoint_refusal(
    refusal: SlotRefusedError,
    state: TrainingState,
    writers: tuple[StepWriter, ...],
    commits: Commits,
    *,
    collective: bool,
) -> None:
    """Record `refusal` in the state and, unless the save would be `collective`, checkpoint it
    (after the pending writes) with the groups consumed so far: nothing can fill that slot, so
    a resume of this checkpoint fails at once too (unless it was a collective save the other
    ranks cannot join)."""
    state.refused_slots = {**state.refused_slots, refusal.group_id: str(refusal)}
    for writer in writers:
        writer.drain()
    if not collective:
        commits.commit(state)


def _refused(state: TrainingState, metrics: dict[str, float]) -> LearnerOutcome:
    """The trial's end when a slot can never be filled: the first refusal's line."""
    group_id = min(state.refused_slots)
    reason = f"step {state.step}: {state.refused_slots[group_id]}"
    return LearnerOutcome(TrialStatus.FAILED, state.step, reason, metrics)


def _pad_id(config: object) -> int:
    pad = getattr(config, "pad_token_id", None)
    return 0 if pad is None else int(pad)
