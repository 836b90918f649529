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
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import redis

from buffer.connection import BufferConnectionError, RunStateLostError, redis_failures_in_one_line
from buffer.eval_requests import EvalRequests
from buffer.schema import RecordError, RolloutGroup, encode_group, make_group_id
from buffer.streams import (
    RolloutProducer,
    RolloutSink,
    TicketDispenser,
    VersionRegistry,
    admission_limit,
    connect,
    fixed_policy_version,
    synced_version,
    ticket_batch,
    ticket_draw,
)
from buffer.versions import InitialWeightsMismatchError, RunStateWatch
from contract import metrics as M
from contract.layout import WEIGHTS_DIR, TrialPaths
from contract.trial import TrialSpec
from harness.config import ExperimentConfig
from harness.generators import GenRequest, make_generator, sample_seed
from harness.models.model_dir import build_model_dir, weights_digest
from harness.models.tokenizer import encode_prompt, load_tokenizer, response_text
from harness.signals import SignalLatch, install
from harness.storage.remote_weights import WeightFetcher
from harness.storage.setup import setup_component_sync
from harness.tasks.mixture import make_train_mixture
from harness.trial.fault_files import crash_if_armed
from harness.trial.generator_evals import GeneratorEvals, Loaded
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


@dataclass
class GeneratorStats:
    """Counters behind perf/gen_tokens_per_s, perf/gen_idle_frac, perf/weight_sync_s and
    perf/gen_cpu_frac, all of this generator (its telemetry hash and its final log line carry
    them per generator id; the learner's row combines them over generators)."""

    started: float = field(default_factory=time.monotonic)
    # CPU seconds of this process (every thread) when the stats began: a warm process has used
    # CPU in earlier trials, which this trial's share must not count.
    cpu_started: float = field(default_factory=time.process_time)
    tokens: int = 0
    generate_s: float = 0.0
    idle_s: float = 0.0
    sync_s: float = 0.0
    syncs: int = 0
    groups: int = 0
    eval_s: float = 0.0  # running the learner's eval requests (`generator_evals`)

    def as_metrics(self) -> dict[str, float]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {
            M.PERF_GEN_TOKENS_PER_S: self.tokens / max(self.generate_s, 1e-9),
            M.PERF_GEN_IDLE_FRAC: self.idle_s / elapsed,
            M.PERF_WEIGHT_SYNC_S: self.sync_s / max(self.syncs, 1),
            M.PERF_GEN_CPU_FRAC: self.cpu_frac(elapsed),
            "groups": float(self.groups),
            "eval_s": self.eval_s,  # with groups, in the telemetry hash and the final log line
        }

    def cpu_frac(self, elapsed: float) -> float:
        """perf/gen_cpu_frac: this process's CPU seconds since the stats began over `elapsed`
        wall seconds x the CPUs it may run on (its executor.cpu_sets set when pinned)."""
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return (time.process_time() - self.cpu_started) / (elapsed * max(cpus or 1, 1))


class GroupMaker:
    """Turns claimed tickets into scored rollout groups with one generator call."""

    def __init__(self, cfg: ExperimentConfig, spec: TrialSpec, run_id: str, generator_id: str):
        self.cfg, self.spec = cfg, spec
        self.run_id, self.generator_id = run_id, generator_id
        self.model_dir = build_model_dir(cfg.model, cfg.task)
        self.initial_weights = weights_digest(self.model_dir)  # checked against the learner's
        self.tokenizer = load_tokenizer(self.model_dir)
        # The training stream (`task`, or the `train_tasks` mixture), rendered as eval's text.
        self.mixture = make_train_mixture(cfg, self.tokenizer)
        self.generator = make_generator(cfg.generation, self.model_dir, spec.seed)

    def request(self, ticket: int, prompt_text: str) -> GenRequest:
        per_step, group_size = self.cfg.learner.prompts_per_step, self.cfg.generation.group_size
        batch = ticket_batch(ticket, per_step)
        return GenRequest(
            prompt_ids=encode_prompt(self.tokenizer, prompt_text),
            seeds=[sample_seed(self.spec.seed, batch, ticket, j) for j in range(group_size)],
            max_new_tokens=self.cfg.generation.max_new_tokens,
        )

    def make(
        self,
        tickets: list[int],
        version: int,
        stats: GeneratorStats,
        updates: PublishedUpdates | None = None,
    ) -> list[RolloutGroup]:
        """The scored groups of `tickets`, generated from `version` (with `updates`, a partial
        rollout: later tokens, and later groups of the call, may come from newer versions; each
        group's policy_version is the version it started with, each token keeps its own)."""
        drawn = [self.mixture.prompt(self.spec.seed, ticket) for ticket in tickets]
        prompts = [prompt for _, prompt in drawn]
        requests = [self.request(t, p.text) for t, p in zip(tickets, prompts, strict=True)]
        started = time.monotonic()
        generation_started = datetime.now(UTC)  # wall clock: staleness accounting reads it
        results = self.generator.generate(requests, updates)
        stats.generate_s += time.monotonic() - started
        groups = []
        per_step = self.cfg.learner.prompts_per_step
        for ticket, (component, prompt), request, result in zip(
            tickets, drawn, requests, results, strict=True
        ):
            # Special tokens (EOS) removed, as in eval: EOS sets finish_reason, not the reward.
            texts = [response_text(self.tokenizer, ids) for ids in result.response_ids]
            # Each prompt is scored by the verifier of the task it came from.
            scored = [component.reward_fn(text, prompt.ground_truth) for text in texts]
            stats.tokens += sum(len(ids) for ids in result.response_ids)
            versions = result.token_versions
            start = min((v[0] for v in versions if v), default=version) if versions else version
            created_at = datetime.now(UTC)
            groups.append(
                RolloutGroup(
                    run_id=self.run_id,
                    group_id=make_group_id(self.spec.seed, ticket_batch(ticket, per_step), ticket),
                    prompt_index=ticket,
                    prompt_ids=request.prompt_ids,
                    response_ids=result.response_ids,
                    behavior_logprobs=result.behavior_logprobs,
                    rewards=[float(reward) for reward, _ in scored],
                    reward_infos=[json.dumps(info, sort_keys=True) for _, info in scored],
                    finish_reasons=result.finish_reasons,
                    policy_version=start,
                    generator_id=self.generator_id,
                    created_at=created_at,
                    # min: a wall-clock step back during generation must not void the record
                    generation_started_at=min(generation_started, created_at),
                    routed_experts=result.routed_experts,
                    token_versions=versions,
                )
            )
        return groups


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
) -> None:
    """Push a round's groups together (buffer.push_many: two round trips for all of them), each
    completing its ticket. A group over `limit` (the buffer's max_message_bytes) is a
    GeneratorFatalError naming the size it needs (the same seeds would make the same group after
    a restart); nothing of the round is sent then."""
    try:
        buffer.push_many(groups, batch_index=batch_index, tickets=tickets)
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
    partial = spec.mode == "bounded" and cfg.staleness.partial_rollouts
    updates = (
        PublishedUpdates(
            versions,
            cfg.staleness.sync_every,
            cfg.staleness.partial_check_tokens,
            fetcher,
        )
        if partial
        else None
    )
    carry: list[int] = []  # a claimed ticket of the next batch, generated on the next round
    checked = False
    buffer.report_generator_stats(generator_id, stats.as_metrics())  # registered: ready

    while not (stop.caught or buffer.stop_requested()):
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
        limit = min(admission_limit(published, spec.lag, per_step), total)
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
        sync_every = cfg.staleness.sync_every
        want = (
            fixed_policy_version(batch_index, spec.lag, sync_every)
            if spec.mode == "fixed"
            else synced_version(published, sync_every)
        )
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
        push_round(buffer, groups, batch_index=draw, tickets=claimed, limit=message_limit)
        stats.groups += len(groups)
        buffer.report_generator_stats(generator_id, stats.as_metrics())
    maker.generator.close()
    buffer.report_generator_stats(generator_id, stats.as_metrics())
    print(json.dumps({"generator": generator_id, **stats.as_metrics()}), flush=True)
    return stats
