"""What a learner run is given (`LearnerTask`, built by the harness), what it talks to
(`LearnerPorts`) and how it ended (`LearnerOutcome`): the ends of
`learner.runtime.loop.run_learner`, in a module of their own so the loop's components (take,
resume) read them without importing the loop."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from buffer.staleness import StalenessPolicy, staleness_policy
from buffer.streams import RolloutSource, TelemetryReader, VersionPublisher, WeightWriter
from contract.evals import EvalReport
from contract.trial import StalenessMode, TrialStatus
from learner.algorithms.sampling_dist import PLAIN, SamplingSettings
from learner.config import ArmBase, LearnerConfig


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
    # prompt index alone (buffer.intake).
    prompt_ids: Callable[[int], Sequence[int]] | None = None
    # Token ids -> text, for the rollout log's text columns (learner.runtime.records); None:
    # they are left null. The harness supplies its tokenizer's, the learner imports none.
    decode: TextDecoder | None = None
    # staleness.sync_every: generators take new weights only every this many steps
    # (buffer.tickets.synced_version), so groups may be up to sync_every - 1 versions staler.
    sync_every: int = 1

    @property
    def policy(self) -> StalenessPolicy:
        """The trial's staleness rule (`buffer.staleness`): how it takes, resumes and checks."""
        return staleness_policy(self.mode, self.lag, self.sync_every)

    @property
    def max_lag(self) -> int:
        """The oldest lag a trained group may have: `lag`, plus what the sync interval adds."""
        return self.policy.max_lag

    @property
    def total_steps(self) -> int:
        """The steps this run trains: `steps` when capped, else `learner.steps`."""
        return self.steps or self.learner.steps


@dataclass(frozen=True)
class TextDecoder:
    """How the harness's tokenizer turns token ids into text (a port: the learner package knows
    no tokenizer): `prompt` as rendered, `response` as the verifier read it."""

    prompt: Callable[[Sequence[int]], str]
    response: Callable[[Sequence[int]], str]


class EvalPort(Protocol):
    """The evals of published versions, which the generators run (`buffer.eval_requests`): the
    learner asks once a version is published and records what comes back, so no learner rank
    ever holds a second copy of the policy for them."""

    def request(self, version: int) -> str:
        """Ask for the evals of published `version`; returns the request's id."""
        ...

    def wait(self, request_id: str) -> tuple[EvalReport | float, float]:
        """(the report, or the primary pass rate alone; seconds the evals took) of a request."""
        ...

    def pending_versions(self) -> set[int]:
        """Versions asked for and not yet answered: the weight store keeps them."""
        ...


def nothing_to_upload() -> None:
    """A trial whose files stay on this node: its checkpoint is where a resume reads it."""


@dataclass(frozen=True)
class LearnerPorts:
    """What the learner reads from and writes to, besides files: the rollout stream, the
    generators' telemetry, the version registry, the weight store and the eval requests. Built by
    the harness (Redis, local or remote weights) or a test; ranks other than 0 get stand-ins
    that refuse every call, since rank 0 alone talks to them."""

    buffer: RolloutSource
    telemetry: TelemetryReader
    versions: VersionPublisher
    weights: WeightWriter
    evals: EvalPort
    # The commit's first step: make the newest checkpoint durable where a resume on another
    # node reads it (the trial's bucket), before Redis lets go of the groups it covers
    # (`learner.runtime.resume.commit_groups`).
    before_ack: Callable[[], None] = nothing_to_upload


@dataclass
class LearnerOutcome:
    status: TrialStatus  # completed | diverged | failed (a batch that can never be complete)
    steps_completed: int
    diverged_reason: str | None = None  # why it diverged or failed, one line
    final_metrics: dict[str, float] = field(default_factory=dict)
