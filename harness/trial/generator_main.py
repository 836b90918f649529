"""`harness generator`: sample groups for the learner, score them, push them to the buffer.

The loop: claim work tickets under the staleness rule, make sure the right policy version is
loaded, generate every sample of the claimed prompts in one engine call, score with the task's
verifier, push one group per prompt. Ticket t is prompt index t of batch t // prompts_per_step,
so prompts and sampling seeds are a pure function of (seed, batch, prompt, sample): every arm of
a seed sees the same prompts and the same random numbers (design section 1). An arm with
dynamic sampling also gets extra-round tickets its learner asks for (`buffer.tickets`): prompts
and seeds of their own, generated with the batch's version and pushed as one draw.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import redis

from buffer.connection import BufferConnectionError, RunStateLostError, redis_failures_in_one_line
from buffer.eval_requests import EvalRequests
from buffer.record_types import RecordError
from buffer.rollout_group import RolloutGroup
from buffer.schema import encode_group
from buffer.staleness import staleness_policy
from buffer.streams import (
    RolloutProducer,
    RolloutSink,
    TicketDispenser,
    VersionRegistry,
    connect,
    ticket_batch,
    ticket_draw,
)
from buffer.versions import InitialWeightsMismatchError, RunStateWatch
from contract.layout import WEIGHTS_DIR, TrialPaths
from contract.trial import TrialSpec
from harness.config import ExperimentConfig
from harness.signals import SignalLatch, install
from harness.storage.remote_weights import WeightFetcher
from harness.storage.setup import setup_component_sync
from harness.trial.fault_files import crash_if_armed
from harness.trial.generator_evals import GeneratorEvals, Loaded
from harness.trial.rollout_groups import GeneratorStats, GroupMaker
from harness.trial.weight_updates import PublishedUpdates

IDLE_POLL_S = 0.5
LOCATION_RESTORE_WAIT_S = 30.0
# Fault injection for kill/restart tests: while the file this names exists and holds ticket t, the
# generator that claims t deletes it and exits abruptly holding the leases of its claim (as a
# SIGKILL would).
FAULT_CRASH_FILE_ENV = "HARNESS_FAULT_GENERATOR_CRASH_FILE"


class GeneratorFatalError(RuntimeError):
    """An error a restart cannot fix (the restarted generator would make the same group and fail
    the same way); `harness generator` exits with EXIT_NO_RESTART and this one-line message."""


def claim_batch(
    tickets: TicketDispenser,
    generator_id: str,
    *,
    limit: int,
    per_step: int,
    carry: list[int],
    most: int,
) -> tuple[list[int], list[int]]:
    """Claim up to `most` tickets (at most one batch's), all of one draw: one round of one
    batch (so, one version and one push).

    A ticket of another draw ends the round and is carried to the next one (it stays leased
    to this generator), so no claim is ever given back and re-raced.
    """
    claimed = list(carry)
    while len(claimed) < min(most, per_step):
        ticket = tickets.claim(generator_id, limit)
        if ticket is None:
            break
        if claimed and ticket_draw(ticket, per_step) != ticket_draw(claimed[0], per_step):
            return claimed, [ticket]
        claimed.append(ticket)
    return claimed, []


def push_round(
    buffer: RolloutSink,
    groups: list[RolloutGroup],
    *,
    batch_index: int,
    tickets: list[int],
    limit: int,
    timeline: int = 0,
) -> None:
    """Push a round's groups together (buffer.push_many: two round trips for all of them), each
    completing its ticket, tagged with the run's `timeline` number their weights were loaded at
    (`buffer.timeline`). A group over `limit` (the buffer's max_message_bytes) is a
    GeneratorFatalError naming the size it needs (the same seeds would make the same group after
    a restart); nothing of the round is sent then."""
    try:
        buffer.push_many(groups, batch_index=batch_index, tickets=tickets, timeline=timeline)
    except RecordError:
        sizes = {g.group_id: len(encode_group(g)) for g in groups}
        group = max(groups, key=lambda g: sizes[g.group_id])
        size = sizes[group.group_id]
        if size <= limit:
            raise
        raise GeneratorFatalError(
            f"group {group.group_id} (prompt {group.prompt_index}) encodes to {size} bytes, over "
            f"buffer.max_message_bytes={limit}; set buffer.max_message_bytes to at least {size} "
            "(with room for longer prompts and responses) or lower generation.max_new_tokens"
        ) from None


def _restored_location(versions: VersionRegistry, version: int, batch_index: int) -> str:
    """The location of `version` once a resume restored it from the weight store (the supervisor
    does before generators start, a learner when it resumes); GeneratorFatalError after
    LOCATION_RESTORE_WAIT_S: the weight store lost it too, and a restart cannot help."""
    deadline = time.monotonic() + LOCATION_RESTORE_WAIT_S
    while True:
        try:
            return versions.location(version)
        except KeyError as exc:
            if time.monotonic() >= deadline:
                raise GeneratorFatalError(
                    f"{exc.args[0]}, which batch {batch_index} needs: Redis lost part of the "
                    "run's state (an AOF cut short by a crash or a full disk) and the weight "
                    "store no longer holds that version; rerun the trial without --resume"
                ) from None
        time.sleep(IDLE_POLL_S)


def run_generator_component(
    cfg: ExperimentConfig,
    spec: TrialSpec,
    *,
    redis_url: str,
    run_id: str,
    generator_id: str,
    steps: int | None,
    trial_dir: Path | None = None,
) -> GeneratorStats:
    """Generate until every ticket of the trial is done or a stop is requested."""
    stop = SignalLatch()
    install(stop.set)  # for the rest of the process: a signal ends the loop between pushes
    maker = GroupMaker(cfg, spec, run_id, generator_id)
    watch = RunStateWatch(run_id)  # a reconnect to a Redis that restarted empty fails
    try:
        with (
            redis_failures_in_one_line(redis_url),
            connect(
                redis_url, cfg.buffer.tls_ca_file, check_connection=watch.check_connection
            ) as client,
        ):
            return _generate(
                cfg,
                spec,
                client,
                maker=maker,
                stop=stop,
                run_id=run_id,
                generator_id=generator_id,
                steps=steps,
                watch=watch,
                fetcher=weight_fetcher(trial_dir),
            )
    except (BufferConnectionError, RunStateLostError, InitialWeightsMismatchError) as exc:
        # a restart meets the same Redis, and the same model
        raise GeneratorFatalError(str(exc)) from None


def weight_fetcher(trial_dir: Path | None) -> WeightFetcher | None:
    """With a private working copy (Ray executor, trial output in a bucket), versions come
    from the bucket into this copy; otherwise the announced path is read where it is."""
    sync = setup_component_sync(trial_dir) if trial_dir is not None else None
    if sync is None:
        return None
    return WeightFetcher(TrialPaths(trial_dir).weights, sync.remote.child(WEIGHTS_DIR))


def _generate(
    cfg: ExperimentConfig,
    spec: TrialSpec,
    client: redis.Redis,
    *,
    maker: GroupMaker,
    stop: SignalLatch,
    run_id: str,
    generator_id: str,
    steps: int | None,
    watch: RunStateWatch | None = None,
    fetcher: WeightFetcher | None = None,
) -> GeneratorStats:
    """The loop of `run_generator_component`; the caller owns (and closes) `client`."""
    buffer = RolloutProducer(client, run_id, cfg.buffer)  # creates no consumer group
    tickets = TicketDispenser(client, run_id)
    versions = VersionRegistry(client, run_id, watch=watch)
    per_step = cfg.learner.prompts_per_step
    total = (steps or cfg.learner.steps) * per_step
    stats = GeneratorStats()
    most = cfg.generation.max_prompts_per_call or per_step
    message_limit = cfg.buffer.max_message_bytes
    loaded = Loaded(0)  # the engine starts on the initial weights, version 0
    evals = GeneratorEvals(
        cfg,
        spec.seed,
        maker.generator,
        requests=EvalRequests(client, run_id),
        versions=versions,
        generator_id=generator_id,
        model_dir=maker.model_dir,
        fetcher=fetcher,
    )
    regime = cfg.regime(spec.arm)  # the experiment's staleness with the arm's own on top
    policy = staleness_policy(spec.mode, spec.lag, regime.sync_every)
    partial = policy.partial_rollouts and regime.partial_rollouts
    updates = (
        PublishedUpdates(
            versions,
            regime.sync_every,
            cfg.staleness.partial_check_tokens,
            fetcher,
        )
        if partial
        else None
    )
    carry: list[int] = []  # a claimed ticket of the next batch, generated on the next round
    seen_rewinds = 0  # the run's timeline number at the last round
    checked = False
    buffer.report_generator_stats(generator_id, stats.as_metrics())  # registered: ready

    while not (stop.caught or buffer.stop_requested()):
        # Read before the registry: every weight this round loads is then of this timeline
        # or a later one, so the number tagged on its groups is never too new.
        timeline = versions.timeline()
        if timeline.number > seen_rewinds:  # rewinds since the last round: forget what they
            back_to = min(timeline.rewinds[seen_rewinds:])  # withdrew (`buffer.timeline`)
            if fetcher is not None:
                fetcher.forget_after(back_to)
            if updates is not None:
                updates.rewound()
            seen_rewinds = timeline.number
        if timeline.withdrawn(loaded.version, loaded.timeline):
            loaded.version = -1  # a rewind withdrew these weights: load the version again
        loaded.timeline = timeline.number
        current = versions.current()
        if current is None:  # the learner has not published v0 yet: nothing is admissible
            idle_from = time.monotonic()
            with contextlib.suppress(TimeoutError):
                versions.wait_for_version(0, timeout_s=IDLE_POLL_S)
            stats.idle_s += time.monotonic() - idle_from
            continue
        if not checked:  # v0 is out, so the learner has named the run's initial weights
            versions.check_initial_weights(maker.initial_weights, f"generator {generator_id}")
            checked = True
        # The learner waits for these (its step records, or at lag 0 its next batch's
        # version was published before them): answer before claiming more rollout work.
        stats.eval_s += evals.serve(loaded)
        published = current[0]
        limit = min(policy.admission_limit(published, per_step), total)
        claimed, carry = claim_batch(
            tickets, generator_id, limit=limit, per_step=per_step, carry=carry, most=most
        )
        if not claimed:
            # Every ticket done, a generator still answers eval requests (the last version's
            # comes after the last batch) and, with dynamic sampling, extra rounds the learner
            # may ask for: generators run until the trial's stop request.
            idle_from = time.monotonic()
            with contextlib.suppress(TimeoutError):
                versions.wait_for_version(published + 1, timeout_s=IDLE_POLL_S)
            stats.idle_s += time.monotonic() - idle_from
            buffer.report_generator_stats(generator_id, stats.as_metrics())
            continue
        crash_if_armed(FAULT_CRASH_FILE_ENV, claimed.__contains__, f"holding tickets {claimed}")
        batch_index = ticket_batch(claimed[0], per_step)  # extra rounds: the batch's version
        want = policy.ticket_version(batch_index, published)
        if want != loaded.version:
            try:
                location = versions.wait_for_version(want, timeout_s=cfg.buffer.push_timeout_s)
            except KeyError:  # published, then its location lost (an AOF cut short)
                location = _restored_location(versions, want, batch_index)
            if fetcher is not None:  # the announced path is on the learner's node
                location = fetcher.fetch(want)
            stats.sync_s += maker.generator.load_weights(want, location)
            stats.syncs += 1
            loaded.version = want
        if updates is not None:
            switches, switch_s = updates.switches, updates.switch_s
        groups = maker.make(claimed, loaded.version, stats, updates)
        if updates is not None:  # weights loaded mid-generation count as weight syncs
            stats.syncs += updates.switches - switches
            stats.sync_s += updates.switch_s - switch_s
            loaded.version = maker.generator.version
        draw = ticket_draw(claimed[0], per_step)  # the batch itself for round 0
        push_round(
            buffer,
            groups,
            batch_index=draw,
            tickets=claimed,
            limit=message_limit,
            timeline=loaded.timeline,
        )
        stats.groups += len(groups)
        buffer.report_generator_stats(generator_id, stats.as_metrics())
    maker.generator.close()
    if updates is not None:
        updates.close()
    buffer.report_generator_stats(generator_id, stats.as_metrics())
    print(json.dumps({"generator": generator_id, **stats.as_metrics()}), flush=True)
    return stats
