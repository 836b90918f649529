"""A trial's staleness rule, in one place: fixed lag or bounded lag (design section 5).

Both sides of the buffer ask the same object, chosen once from the trial's mode, lag and sync
interval (`staleness_policy`): the generator which weights a ticket's groups are made with and
how far ahead it may claim; the learner whether a group's versions are the rule's, how stale it
is, whether its take may drop groups and whether a resume replays the steps after a checkpoint
exactly; the config which options the rule admits (partial rollouts, dynamic sampling's extra
rounds); the report what the rule is called. Nothing outside this module compares a mode's
name, so a third rule is one more class here.

- `FixedLag`: batch k is generated with exactly version max(0, k - lag) (its sync interval's
  multiple at or below it) and trained by batch index, so arrival order cannot matter and a
  run repeats bit for bit; a resume replays the groups committed after its checkpoint.
- `BoundedLag`: free-running generators claim at most `lag` versions ahead of the newest
  published weights; the learner trains groups in arrival order and drops those older than
  `lag + sync_every - 1` versions; a resume cannot replay, so it withdraws what came after the
  checkpoint (`buffer.rewind.rewind_bounded`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Literal, TypeVar

import numpy as np

from buffer.rollout_group import RolloutGroup
from buffer.tickets import admission_limit, fixed_policy_version, synced_version
from contract.regime import regime_words
from contract.trial import StalenessMode

Versions = TypeVar("Versions", int, np.ndarray)
RuleOption = Literal["partial_rollouts", "dynamic_sampling_rounds"]
"""The options a rule may refuse (`StalenessPolicy.refusal`)."""


def group_lag(learner_version: int, policy_version: Versions) -> Versions:
    """How many versions behind the learner a group (or a token) is: the learner's version
    minus the version that made it (design section 5; the `staleness/*` metrics, the rollout
    log's `lag`, bounded mode's drop rule); elementwise over an array of versions."""
    return learner_version - policy_version


class StalenessPolicy(ABC):
    """One trial's staleness rule (module docstring); `lag` is the lag (fixed) or the max lag
    (bounded), `sync_every` the generators' weight-sync interval."""

    mode: ClassVar[StalenessMode]
    replays_exactly: ClassVar[bool]
    """Groups are a pure function of the batch index, so a step can be taken again exactly: a
    resume replays what came after its checkpoint (and may fall back past a damaged one), a
    group refused at intake is refused again on every retry, replayed weights are verified."""
    extra_rounds: ClassVar[bool]
    """DAPO's extra rounds of a batch can be generated with the batch's own version."""
    partial_rollouts: ClassVar[bool]
    """A response may continue on newer weights published while it is generated."""

    def __init__(self, lag: int, sync_every: int = 1) -> None:
        if lag < 0 or sync_every < 1:
            raise ValueError(f"staleness lag={lag} must be >= 0 and sync_every={sync_every} >= 1")
        self.lag, self.sync_every = lag, sync_every

    @property
    def max_lag(self) -> int:
        """The oldest lag a trained group may have: `lag`, plus what the sync interval adds (a
        generator that loads weights every s steps may use a version s - 1 steps old)."""
        return self.lag + self.sync_every - 1

    def admission_limit(self, published: int, prompts_per_step: int) -> int:
        """Tickets below this may be claimed once `published` is the newest version."""
        return admission_limit(published, self.lag, prompts_per_step)

    @abstractmethod
    def ticket_version(self, batch_index: int, published: int) -> int:
        """The version a generator makes batch `batch_index`'s groups with, `published` being
        the newest version out."""

    @abstractmethod
    def version_problem(
        self, group: RolloutGroup, batch_index: int, learner_version: int
    ) -> str | None:
        """Why `group`'s versions break the rule for `batch_index` (the learner at
        `learner_version` as it takes it), or None."""

    def words(self, partial_rollouts: bool = False) -> str:
        """The rule as the report's `policy` column says it (`contract.regime`)."""
        return regime_words(self.mode, self.lag, self.sync_every, partial_rollouts)

    @classmethod
    def refusal(cls, option: RuleOption, where: str) -> str | None:
        """Why this rule refuses `option` ("partial_rollouts" or "dynamic_sampling_rounds"),
        set at `where`, in one line naming the field; None when it admits it."""
        if option == "partial_rollouts" and not cls.partial_rollouts:
            return (
                f"{where} needs staleness.mode: bounded: {cls.mode} mode generates each batch "
                "with exactly one version (and so repeats bit for bit), while a partial rollout "
                "takes new weights whenever they are published"
            )
        if option == "dynamic_sampling_rounds" and not cls.extra_rounds:
            return (
                f"{where} set dynamic_sampling_rounds, which needs staleness.mode: fixed (got "
                f"{cls.mode}): extra rounds are generated for one batch by its fixed policy "
                "version; set staleness.mode: fixed or remove dynamic_sampling_rounds"
            )
        return None


class FixedLag(StalenessPolicy):
    """Batch k is made with exactly version max(0, k - lag) and trained by batch index."""

    mode = "fixed"
    replays_exactly = True
    extra_rounds = True
    partial_rollouts = False

    def ticket_version(self, batch_index: int, published: int) -> int:
        return fixed_policy_version(batch_index, self.lag, self.sync_every)

    def version_problem(
        self, group: RolloutGroup, batch_index: int, learner_version: int
    ) -> str | None:
        want = self.ticket_version(batch_index, learner_version)
        version = group.policy_version
        if version != want:
            synced = f" syncing every {self.sync_every} steps" if self.sync_every > 1 else ""
            return (
                f"policy_version {version}, but fixed mode at lag {self.lag}{synced} generates "
                f"batch {batch_index} with version {want}"
            )
        if group.token_versions is not None:
            return (
                f"tokens of versions {version}..{group.newest_token_version}, but fixed mode "
                f"generates every token of batch {batch_index} with version {want} (responses "
                "continued across versions are bounded mode's partial rollouts)"
            )
        return None


class BoundedLag(StalenessPolicy):
    """Free-running generators at most `lag` versions ahead; groups trained in arrival order,
    those older than `max_lag` dropped."""

    mode = "bounded"
    replays_exactly = False
    extra_rounds = False
    partial_rollouts = True

    def ticket_version(self, batch_index: int, published: int) -> int:
        return synced_version(published, self.sync_every)

    def version_problem(
        self, group: RolloutGroup, batch_index: int, learner_version: int
    ) -> str | None:
        if group.policy_version > learner_version:
            return (
                f"policy_version {group.policy_version} is newer than the learner's version "
                f"{learner_version}; no generator can have its weights"
            )
        if group.newest_token_version > learner_version:
            return (
                f"a token of version {group.newest_token_version} is newer than the learner's "
                f"version {learner_version}; no generator can have its weights"
            )
        return None


POLICIES: dict[StalenessMode, type[StalenessPolicy]] = {"fixed": FixedLag, "bounded": BoundedLag}


def staleness_policy(mode: StalenessMode, lag: int, sync_every: int = 1) -> StalenessPolicy:
    """The rule of a trial of `mode` at `lag` whose generators sync every `sync_every` steps."""
    return POLICIES[mode](lag, sync_every)
