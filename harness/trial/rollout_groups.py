"""What a generator makes of claimed tickets: scored rollout groups (`GroupMaker`, one engine
call per round), and the counters behind its perf/* telemetry (`GeneratorStats`).

Ticket t is prompt index t of batch t // prompts_per_step, so prompts and sampling seeds are a
pure function of (seed, batch, prompt, sample): every arm of a seed sees the same prompts and the
same random numbers (design section 1). Split from `harness.trial.generator_main`, the loop
that claims, loads versions, serves evals and pushes.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from buffer.rollout_group import RolloutGroup
from buffer.schema import make_group_id
from buffer.streams import ticket_batch
from contract import metrics as M
from contract.trial import TrialSpec
from harness.config import ExperimentConfig
from harness.generators import GenRequest, make_generator, sample_seed
from harness.models.model_dir import build_model_dir, weights_digest
from harness.models.tokenizer import encode_prompt, load_tokenizer, response_text
from harness.tasks.mixture import make_train_mixture
from harness.trial.weight_updates import PublishedUpdates


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
