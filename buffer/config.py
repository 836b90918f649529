"""Configuration of the rollout buffer and the staleness rule (design sections 4, 5, 9)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from buffer.staleness import POLICIES
from contract.trial import StalenessMode

AppendFsync = Literal["off", "everysec", "always"]


class BufferConfig(BaseModel):
    """Where rollouts travel and how much of them may wait."""

    model_config = ConfigDict(extra="forbid")

    redis_url: str = Field(
        default="",
        description="Redis URL (redis:// or rediss:// with a password). Empty: the harness starts "
        "an embedded redis-server on 127.0.0.1 with a random password under the run dir.",
    )
    tls_ca_file: str | None = Field(
        default=None, description="CA bundle for rediss:// URLs; no effect for redis://."
    )
    max_depth: int = Field(
        default=256,
        gt=0,
        description="Most groups that may wait unconsumed in a run's stream. Producers block (with "
        "`push_timeout_s`) instead of dropping data; no MAXLEN trimming is ever applied.",
    )
    push_timeout_s: float = Field(
        default=600.0, gt=0, description="How long a producer waits for room before failing."
    )
    claim_idle_ms: int = Field(
        default=30_000,
        gt=0,
        description="Entries pending this long on a dead consumer are claimed (XAUTOCLAIM).",
    )
    max_message_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="Payload size limit of one group message; larger ones go to the dead letter.",
    )
    appendfsync: AppendFsync = Field(
        default="everysec",
        description="AOF policy of the embedded Redis: `always` loses nothing on a crash, "
        "`everysec` at most one second, `off` disables AOF. No effect on a remote Redis.",
    )

    @field_validator("appendfsync", mode="before")
    @classmethod
    def _yaml_off_is_a_policy(cls, value: object) -> object:
        """YAML 1.1 reads a bare `off` (in a file or in `buffer.appendfsync=off`) as False."""
        if value is False:
            return "off"
        if value is True:
            raise ValueError("`on`/`true` is not an AOF policy; use always, everysec or off")
        return value


class StalenessConfig(BaseModel):
    """How far behind the learner the policy that generated a group may be (design section 5)."""

    model_config = ConfigDict(extra="forbid")

    mode: StalenessMode = Field(
        default="fixed",
        description="`fixed`: batch k is generated with exactly version max(0, k - lag) and "
        "trained by index (bitwise reproducible). `bounded`: free-running generators at most `lag` "
        "versions ahead (admission control), groups trained in arrival order.",
    )
    lags: list[int] = Field(
        default_factory=lambda: [0],
        min_length=1,
        description="The staleness grid: each value is one trial's lag (fixed) or max_lag "
        "(bounded). 0 is synchronous on-policy training.",
    )

    sync_every: int = Field(
        default=1,
        ge=1,
        description="Generators load new weights only every this many learner steps (TRL's and "
        "verl's weight-sync interval): the version a batch is generated with is the last "
        "multiple of it at or below what the mode's rule gives, max(0, k - lag) (fixed) or the "
        "newest version (bounded). Groups may then be up to sync_every - 1 versions staler: "
        "bounded mode drops only groups older than lag + sync_every - 1. 1 = every step.",
    )

    partial_rollouts: bool = Field(
        default=False,
        description="Bounded mode: when a newer version is published, a generator stops its "
        "in-flight responses at a token boundary, loads the new weights and continues the same "
        "responses (AReaL's interruptible rollouts, verl's partial_rollout), so a response spans "
        "several versions; each token keeps the version that sampled it and its behaviour "
        "log-prob under that version. Refused in fixed mode (which generates every batch with "
        "one version, deterministically).",
    )
    partial_check_tokens: int = Field(
        default=1,
        ge=1,
        description="With partial_rollouts: how often, in decoded tokens, a generator looks for "
        "a newer version (a Redis read each time).",
    )

    @model_validator(mode="after")
    def _check_partial(self) -> StalenessConfig:
        rule = POLICIES[self.mode]
        problem = rule.refusal("partial_rollouts", "staleness.partial_rollouts")
        if self.partial_rollouts and problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _check_lags(self) -> StalenessConfig:
        bad = [lag for lag in self.lags if lag < 0]
        if bad:
            raise ValueError(f"staleness.lags must be >= 0, got {bad}")
        if len(set(self.lags)) != len(self.lags):
            raise ValueError(f"staleness.lags has duplicates: {self.lags}; list each lag once")
        return self
