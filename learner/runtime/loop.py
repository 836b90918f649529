"""The learner's training loop: take a batch, train, publish weights, commit, log. Top to bottom.

A step k (0-based) trains on batch k and produces policy version k + 1. The step is *published*
as soon as its weights are in the weight store and the version registry names them (generators
may use it), and *committed* at a checkpoint: the checkpoint is written first, then the groups
trained since the previous checkpoint are marked trained and acknowledged in Redis. A learner
killed between two checkpoints therefore finds those groups still pending under its consumer
name, resumes from the checkpoint and retrains them identically (fixed mode is bitwise
reproducible), and a group is never trained twice across commits.

Data-parallel (`torchrun`, `learner.runtime.distributed`): rank 0 alone takes, publishes, evaluates,
logs and commits; it broadcasts each batch, which keeps the other ranks in lockstep, and every
rank trains its share of it and loads the checkpoint on resume. Sharded (`learner.parallel=fsdp`),
every rank also takes part in gathering each version's full weights (`PublishedWeights`) and in
writing each checkpoint's shards; the collectives run in the same order on every rank: batch
broadcast, training, gather, checkpoint.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn

from buffer.collate import collate
from buffer.schema import RolloutGroup
from buffer.streams import (
    Delivery,
    RolloutSource,
    SlotRefusedError,
    TelemetryReader,
    VersionPublisher,
    WeightWriter,
    draw_key,
)
from contract import metrics as M
from contract.evals import EvalReport
from contract.layout import TrialPaths
from contract.trial import StalenessMode, TrialStatus
from learner.algorithms.sampling_dist import PLAIN, SamplingSettings
from learner.config import ArmBase, LearnerConfig
from learner.runtime.checkpoint import CheckpointStore, ResumeError, TrainingState
from learner.runtime.distributed import SINGLE, DistContext, broadcast_batch
from learner.runtime.dynamic_sampling import take_dynamic
from learner.runtime.evals_log import EvalsLog
from learner.runtime.intake import (
    IntakeRules,
    ModelLimits,
    TrialSlots,
    intake_check,
    model_limits,
)
from learner.runtime.metrics_log import GroupLedger, MetricsLog, step_records
from learner.runtime.models import build_step_models, checkpoint_modules, wrap_ddp
from learner.runtime.published import PublishedWeights
from learner.runtime.staleness_accounting import GroupTiming, group_timing, staleness_metrics
from learner.runtime.step import DivergenceError, StepModels, check_group_split, train_on_batch
from learner.runtime.step_io import StepWriter

SPIKE_WINDOW = 20


@dataclass
class LearnerTask:
    """Everything one learner run needs; built by the harness from the experiment config."""

    arm: ArmBase
    learner: LearnerConfig
    mode: StalenessMode
    lag: int
    seed: int
    group_size: int
    max_new_tokens: int
    model_dir: Path
    trial_dir: Path
    consumer: str = "learner"
    take_timeout_s: float = 600.0
    steps: int | None = None  # cap on learner steps (smoke runs); default learner.steps
    # The generators' sampled distribution: the learner scores tokens under it
    # (learner.runtime.forward).
    sampling: SamplingSettings = PLAIN
    # Prompt index -> the prompt tokens its generator must have used; None: intake checks the
    # prompt index alone (learner.runtime.intake).
    prompt_ids: Callable[[int], Sequence[int]] | None = None


@dataclass
class LearnerOutcome:
    status: TrialStatus  # completed | diverged | failed (a batch that can never be complete)
    steps_completed: int
    diverged_reason: str | None = None  # why it diverged or failed, one line
    final_metrics: dict[str, float] = field(default_factory=dict)


def group_metrics(groups: list[RolloutGroup], step: int) -> dict[str, float]:
    """Reward, length and staleness statistics of a step's batch (design section 7)."""
    rewards = np.array([r for g in groups for r in g.rewards], dtype=np.float64)
    group_std = np.array([np.std(g.rewards) for g in groups])
    lengths = np.array([len(ids) for g in groups for ids in g.response_ids], dtype=np.float64)
    truncated = np.array([f == "length" for g in groups for f in g.finish_reasons])
    lags = np.array([step - g.policy_version for g in groups], dtype=np.float64)
    return {
        M.REWARD_MEAN: float(rewards.mean()),
        M.REWARD_STD: float(rewards.std()),
        M.REWARD_GROUP_STD_MEAN: float(group_std.mean()),
        M.GROUPS_ZERO_ADV_FRAC: float((group_std == 0).mean()),
        M.GROUPS_TRAINED: float(len(groups)),
        M.LENGTH_MEAN: float(lengths.mean()),
        M.LENGTH_P95: float(np.percentile(lengths, 95)),
        M.LENGTH_TRUNCATED_FRAC: float(truncated.mean()),
        M.STALENESS_MEAN: float(lags.mean()),
        M.STALENESS_MAX: float(lags.max()),
    }


def generated_tokens(groups: list[RolloutGroup]) -> float:
    """Response tokens of `groups`: tokens/generated, given every group a step read (trained,
    dropped as too stale and filtered by dynamic sampling alike: not training a group does not
    refund its generation)."""
    return float(sum(len(ids) for group in groups for ids in group.response_ids))


def is_spike(history: list[float], grad_norm: float, factor: float) -> bool:
    """A gradient norm over `factor` x the rolling median of the previous SPIKE_WINDOW steps."""
    window = history[-SPIKE_WINDOW:]
    return len(window) >= 3 and grad_norm > factor * statistics.median(window)


def configure_determinism(seed: int, threads: int) -> None:
    """Seed everything and pin threads: fixed-mode CPU runs are bitwise reproducible."""
    # torch._C.set_num_threads works even where an in-process engine made set_num_threads a no-op.
    torch._C.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))  # noqa: NPY002 - seed the global RNG libraries draw from
    import random

    random.seed(seed)


def run_learner(
    task: LearnerTask,
    *,
    buffer: RolloutSource,
    telemetry: TelemetryReader,
    versions: VersionPublisher,
    weights: WeightWriter,
    evaluate: Callable[[nn.Module, int], EvalReport | float],
    resume: bool = False,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    dist: DistContext = SINGLE,
) -> LearnerOutcome:
    """Train `task.steps` steps; returns how the run ended. Raises on infrastructure errors."""
    cfg = task.learner
    total_steps = task.steps or cfg.steps
    check_group_split(cfg.prompts_per_step, cfg.minibatches, dist.world_size)
    configure_determinism(task.seed, cfg.threads)
    models: StepModels = build_step_models(task.model_dir, task.arm, cfg, total_steps)
    modules = checkpoint_modules(models)  # unwrapped: checkpoints, weight store and eval use these
    train_models = wrap_ddp(models, dist)
    published = PublishedWeights(models, cfg, task.model_dir, dist)
    checkpoints = CheckpointStore(
        TrialPaths(task.trial_dir).checkpoints, records=partial(step_records, task.trial_dir)
    )
    metrics_log = MetricsLog(task.trial_dir)
    evals_log = EvalsLog(task.trial_dir)
    ledger = GroupLedger(task.trial_dir)
    state = TrainingState()
    # A resumed learner restarts at its checkpoint; generators may then need versions back to
    # (checkpoint - lag), so keep every version since the last checkpoint, plus the lag.
    keep = max(cfg.keep_versions, task.lag + cfg.checkpoint_every + 2)
    if resume and checkpoints.has_checkpoints():
        # The newest intact checkpoint (latest.json is a hint); nothing is deleted until it is
        # loaded and the step files it vouches for are checked (else one-line ResumeError).
        state = checkpoints.load(modules, say=partial(print, flush=True) if dist.is_main else None)
        published.forget_initial()
        if dist.is_main:
            checkpoints.verify_records(state.step, task.trial_dir)
            settle_resumed_commits(buffer, state, f"checkpoint step-{state.step:06d}")
            metrics_log.truncate_after(state.step)
            evals_log.truncate_after(state.step)
            ledger.truncate_after(state.step)
    elif dist.is_main:
        # No checkpoint ever completed: start from the initial weights. A resumed learner killed
        # before its first checkpoint may already have published v0 and later versions; it
        # redoes those steps like any resume (publish_unless_done), its uncommitted groups are
        # still pending. (Sharded: the other ranks gathered v0 with rank 0, `PublishedWeights`.)
        if resume:
            settle_resumed_commits(buffer, state, "the initial weights (no checkpoint)")
        metrics_log.truncate_after(-1)
        evals_log.truncate_after(-1)
        ledger.truncate_after(-1)
        location = weights.write(0, published.initial(), config_dir=task.model_dir)
        if resume:
            publish_unless_done(versions, 0, location)
        else:
            versions.publish(0, location)  # a fresh run's registry is empty: anything else is a bug
        with published.eval_model() as model:
            pass_rate = _evaluate(evaluate, model, 0, evals_log)
        metrics_log.append(0, time.time(), {M.EVAL_PASS_RATE: pass_rate, M.TOKENS_GENERATED: 0})
    trained = set(state.trained_group_ids)
    rules = _intake_rules(task, model_limits(models.policy.module.config))
    uncommitted: list[Delivery] = []  # trained since the last checkpoint
    metrics: dict[str, float] = {}
    if task.mode == "fixed" and state.refused_slots:  # the checkpoint recorded one: fail at once
        return _refused_outcome(state, metrics)
    checkpoint_s: float | None = None  # logged on the step after its checkpoint
    with StepWriter() as step_io:  # weights, metric rows, ledger: off the critical path
        while state.step < total_steps:
            step = state.step
            t_wait = time.perf_counter()
            if task.lag == 0 and dist.is_main:
                # Batch `step` is sampled by the version the previous step just handed to the
                # writer: nothing can arrive before that write is done, so waiting for it here
                # costs nothing, and a write that failed (a full disk) ends the run now instead
                # of after the take times out waiting for groups that can never come.
                step_io.drain()
            try:
                taken = (
                    _take(buffer, task, step, trained, rules=rules, total_steps=total_steps)
                    if dist.is_main
                    else Taken([], [], [])
                )
            except SlotRefusedError as exc:
                # Nothing can fill that slot. A checkpoint of this step records why, so a resume
                # fails at once too, then the trial ends with that line.
                state.refused_slots = {**state.refused_slots, exc.group_id: str(exc)}
                step_io.drain()
                if not (published.sharded and dist.world_size > 1):  # else a collective save
                    _commit(checkpoints, state, modules, buffer, uncommitted)  # others can't join
                if dist.world_size > 1:
                    raise  # the other ranks wait in the batch broadcast: end them all
                return _refused_outcome(state, metrics)
            deliveries, dropped = taken.trained, taken.dropped
            taken_at = time.time()
            wait_s = time.perf_counter() - t_wait
            t_train = time.perf_counter()
            groups = [d.group for d in deliveries]
            batch = collate(groups, pad_id=_pad_id(models)) if dist.is_main else None
            batch = broadcast_batch(batch, dist)  # rank 0's batch on every rank
            try:
                result = train_on_batch(
                    train_models,
                    batch,
                    arm=task.arm,
                    learner=cfg,
                    group_size=task.group_size,
                    max_len=task.max_new_tokens,
                    version=step,
                    dist=dist,
                    sampling=task.sampling,
                )
            except DivergenceError as exc:
                # A divergence ends the trial; its groups stay pending (never marked trained).
                reason = f"step {step}: {exc}"
                return LearnerOutcome(TrialStatus.DIVERGED, state.step, reason, metrics)
            state.step = step + 1
            state.updates += cfg.ppo_epochs * cfg.minibatches
            t_publish = time.perf_counter()  # the snapshot; writing it overlaps the next step
            snapshot = published.snapshot()  # sharded: every rank gathers, rank 0 keeps it
            checkpoint_due = state.step % cfg.checkpoint_every == 0 or state.step == total_steps
            if not dist.is_main:
                if published.sharded and checkpoint_due:
                    checkpoints.save(state, modules, dist)  # this rank's shards
                continue  # rank 0 alone publishes, evaluates, commits and logs
            step_io.submit(
                partial(
                    publish_weights,
                    weights,
                    versions,
                    version=state.step,
                    snapshot=snapshot,
                    task=task,
                    keep=keep,
                )
            )
            publish_s = time.perf_counter() - t_publish
            train_s = t_publish - t_train + publish_s
            # Settled at the checkpoint: every group read, trained or filtered (dynamic
            # sampling), so none is read again; the checkpoint's "trained" ids are these.
            uncommitted += taken.consumed
            trained.update(d.group.group_id for d in taken.consumed)
            state.trained_group_ids = sorted(trained)
            timings = [group_timing(d, step, taken_at) for d in deliveries]
            metrics = group_metrics(groups, step) | result.metrics | taken.sampling_metrics
            metrics |= staleness_metrics(timings, groups, [d.group for d in dropped])
            read = [d.group for d in taken.consumed + dropped]
            metrics[M.TOKENS_GENERATED] = generated_tokens(read)
            grad_norm = metrics[M.OPTIM_GRAD_NORM]
            state.grad_spikes += is_spike(state.grad_norm_history, grad_norm, cfg.grad_spike_factor)
            state.grad_norm_history = [*state.grad_norm_history, grad_norm][-SPIKE_WINDOW:]
            metrics[M.OPTIM_GRAD_SPIKES] = float(state.grad_spikes)
            metrics |= telemetry.buffer_metrics() | telemetry.generator_metrics()
            metrics[M.PERF_LEARNER_STEP_S] = wait_s + train_s
            metrics[M.PERF_LEARNER_WAIT_FRAC] = wait_s / max(wait_s + train_s, 1e-9)
            metrics[M.PERF_LEARNER_TRAIN_S] = train_s - publish_s
            metrics[M.PERF_WEIGHT_PUBLISH_S] = publish_s
            if state.step % cfg.eval_every == 0 or state.step == total_steps:
                t_eval = time.perf_counter()
                with published.eval_model(snapshot) as model:
                    metrics[M.EVAL_PASS_RATE] = _evaluate(evaluate, model, state.step, evals_log)
                metrics[M.PERF_EVAL_S] = time.perf_counter() - t_eval
            if checkpoint_s is not None:  # the previous checkpoint's, see contract.metrics
                metrics[M.PERF_CHECKPOINT_S], checkpoint_s = checkpoint_s, None
            rows = [_provenance(d, t) for d, t in zip(deliveries, timings, strict=True)]
            step_io.submit(partial(metrics_log.append, state.step, time.time(), dict(metrics)))
            step_io.submit(partial(ledger.record, state.step, rows))
            if checkpoint_due:
                t_checkpoint = time.perf_counter()
                # A checkpoint claims steps <= this one: their weights, metric rows and ledger
                # must be on disk first (a resume truncates only what is newer).
                step_io.drain()
                _commit(checkpoints, state, modules, buffer, uncommitted, dist=dist)
                checkpoint_s = time.perf_counter() - t_checkpoint
            if on_step is not None:
                on_step(state.step, metrics)
        return LearnerOutcome(TrialStatus.COMPLETED, state.step, None, metrics)


def _evaluate(
    evaluate: Callable[[nn.Module, int], EvalReport | float],
    model: nn.Module,
    step: int,
    evals_log: EvalsLog,
) -> float:
    """Run the evals of `step` (after `step` updates); returns eval/pass_rate.

    An EvalReport's rows (one per eval set) go to evals.parquet and its primary set's greedy rate
    is eval/pass_rate; a bare float is that rate alone, with no evals rows.
    """
    result = evaluate(model, step)
    if isinstance(result, EvalReport):
        evals_log.append(step, result.scores)
        return result.pass_rate
    return float(result)


def publish_weights(
    weights: WeightWriter,
    versions: VersionPublisher,
    *,
    version: int,
    snapshot: dict[str, torch.Tensor],
    task: LearnerTask,
    keep: int,
) -> None:
    """Write `version`'s weights, announce it, prune old versions (a `StepWriter` job)."""
    location = weights.write(version, snapshot, config_dir=task.model_dir)
    publish_unless_done(versions, version, location)
    weights.prune(keep=keep, protect={0})


def publish_unless_done(versions: VersionPublisher, version: int, location: str) -> None:
    """Publish `version`, unless a run killed after its last checkpoint already did.

    A resumed learner redoes the steps after its checkpoint and rewrites their weights into the
    same weight-store directories; the registry never moves backwards, and in fixed mode the
    redone weights are bitwise the ones already published, so there is nothing to announce.
    """
    current = versions.current()
    if current is None or current[0] < version:
        versions.publish(version, location)


def settle_resumed_commits(buffer: RolloutSource, state: TrainingState, start: str) -> None:
    """Square the run's Redis with what the loaded checkpoint says was trained, before a resume
    deletes anything (`start` names where the learner resumes from).

    Groups Redis committed as trained that the checkpoint lacks were trained after it (a resume
    that fell back past a damaged or deleted newer checkpoint): a commit deletes them from the
    stream, so the steps after the checkpoint can never be retrained; ResumeError (one line)
    now, instead of a wait for them until take_timeout_s. Groups the checkpoint has that Redis
    still holds were trained and not yet committed (a learner killed between its checkpoint and
    the commit): they are committed now, not read back and dropped as too stale."""
    beyond = buffer.committed_beyond(set(state.trained_group_ids))
    if beyond:
        batches = sorted({int(m.group(1)) for m in map(_BATCH_OF_ID.search, beyond) if m})
        span = f"; batches {batches[0]}-{batches[-1]}" if batches else ""
        shown = ", ".join(beyond[:3]) + (", ..." if len(beyond) > 3 else "")
        raise ResumeError(
            f"resuming from {start}, but the run's Redis committed {len(beyond)} group(s) as "
            f"trained after it ({shown}{span}): a commit deletes a group from the buffer, so "
            f"the steps after step {state.step} cannot be retrained; restore the newer "
            "checkpoint (and its step files), or rerun the trial without --resume"
        )
    buffer.recommit(state.trained_group_ids)


_BATCH_OF_ID = re.compile(r"-b(\d+)-p\d+$")


def _provenance(delivery: Delivery, timing: GroupTiming) -> dict[str, object]:
    group = delivery.group
    return {
        "group_id": group.group_id,
        "prompt_index": group.prompt_index,
        "policy_version": group.policy_version,
        "generator_id": group.generator_id,
        "lag": timing.lag,
        "generation_s": timing.generation_s,
        "queue_s": timing.queue_s,
        "age_s": timing.age_s,
    }


def _intake_rules(task: LearnerTask, limits: ModelLimits) -> IntakeRules:
    return IntakeRules(
        mode=task.mode,
        lag=task.lag,
        seed=task.seed,
        prompts_per_step=task.learner.prompts_per_step,
        group_size=task.group_size,
        max_new_tokens=task.max_new_tokens,
        reward_range=task.learner.reward_range,
        limits=limits,
        prompt_ids=task.prompt_ids,
        extra_rounds=task.arm.sampling_rounds(),
    )


@dataclass(frozen=True)
class Taken:
    """What one step read: the groups it trains, those dropped as too stale (bounded mode;
    already acked), every group it consumed (trained and, under dynamic sampling, filtered or
    surplus: settled at the checkpoint) and the dynamic-sampling metrics."""

    trained: list[Delivery]
    dropped: list[Delivery]
    consumed: list[Delivery]
    sampling_metrics: dict[str, float] = field(default_factory=dict)


def _take(
    buffer: RolloutSource,
    task: LearnerTask,
    step: int,
    trained: set[str],
    *,
    rules: IntakeRules,
    total_steps: int,
) -> Taken:
    """The groups of step `step` under the staleness rule, skipping ones already trained, and
    the groups dropped as too stale meanwhile (bounded mode; already acked by the buffer).

    Every group is checked (`learner.runtime.intake`) as it is read, before it can take a slot:
    a refused one goes to the dead letter and the real group still fills its slot. Fixed mode
    raises SlotRefusedError when a slot the trial needs can never be filled. An arm with
    dynamic sampling reads extra rounds of the batch (`learner.runtime.dynamic_sampling`)."""
    n = task.learner.prompts_per_step
    check = intake_check(rules, learner_version=step)
    dropped: list[Delivery] = []
    sampling: dict[str, float] = {}
    if task.mode == "fixed":
        slots = TrialSlots(task.seed, n, total_steps, rules.extra_rounds)

        def take_round(round_index: int) -> list[Delivery]:
            key = draw_key(step, round_index)
            got = buffer.take_batch(
                key, n, task.consumer, task.take_timeout_s, accept=check, slots=slots
            )
            return _without_trained(buffer, got, trained, step, fixed=True)

        if rules.extra_rounds:
            selection = take_dynamic(
                take_round,
                partial(buffer.request_round, step, prompts_per_step=n),
                n_groups=n,
                max_extra_rounds=rules.extra_rounds,
            )
            deliveries, consumed = selection.trained, selection.consumed
            sampling = selection.metrics()
        else:
            deliveries = consumed = take_round(0)
    else:
        taken = buffer.take(n, step, task.lag, task.consumer, task.take_timeout_s, accept=check)
        deliveries, dropped = taken.deliveries, taken.dropped
        deliveries = consumed = _without_trained(buffer, deliveries, trained, step, fixed=False)
    # Arrival order must not matter in fixed mode: train in prompt order (round 0 first).
    deliveries = sorted(deliveries, key=lambda d: (d.group.prompt_index, d.group.group_id))
    return Taken(deliveries, dropped, consumed, sampling)


def _without_trained(
    buffer: RolloutSource,
    deliveries: list[Delivery],
    trained: set[str],
    step: int,
    *,
    fixed: bool,
) -> list[Delivery]:
    """`deliveries` without redelivered copies of committed groups, which are acked, never
    retrained. Fixed mode reads each batch (and round) once, so any such copy means the run's
    Redis and the checkpoint disagree; bounded mode only when nothing else came."""
    fresh = [d for d in deliveries if d.group.group_id not in trained]
    if len(fresh) != len(deliveries):
        stale_ids = [d.entry_id for d in deliveries if d.group.group_id in trained]
        buffer.ack(stale_ids)
        if fixed or not fresh:
            raise RuntimeError(
                f"step {step}: the buffer redelivered groups already trained "
                f"({len(stale_ids)}); the run's Redis state and checkpoint disagree"
            )
    return fresh


def _refused_outcome(state: TrainingState, metrics: dict[str, float]) -> LearnerOutcome:
    """The trial's end when a slot can never be filled: the first refusal's line."""
    group_id = min(state.refused_slots)
    reason = f"step {state.step}: {state.refused_slots[group_id]}"
    return LearnerOutcome(TrialStatus.FAILED, state.step, reason, metrics)


def _commit(
    checkpoints: CheckpointStore,
    state: TrainingState,
    modules: dict[str, object],
    buffer: RolloutSource,
    uncommitted: list[Delivery],
    *,
    dist: DistContext = SINGLE,
) -> None:
    """Checkpoint first, then mark trained and ack: a kill in between only causes a retrain
    that the checkpoint's trained ids already exclude."""
    checkpoints.save(state, modules, dist)
    if uncommitted:
        buffer.commit(uncommitted)  # marks trained and acks in one MULTI
        uncommitted.clear()


def _pad_id(models: StepModels) -> int:
    pad = getattr(models.policy.module.config, "pad_token_id", None)
    return 0 if pad is None else int(pad)
