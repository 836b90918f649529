"""An arm's own staleness regime: the lags it runs at, partial rollouts, the weight-sync interval.

Why on an arm. A staleness study compares regimes (synchronous, bounded lag with and without
partial rollouts, weights synced every k steps) on the same seeds and prompts, and that is what
the harness's arms already are: matched cells that the report compares pairwise, seed by seed.
So a regime other than the experiment's is an arm of its own (`gspo_partial`, objective gspo,
`staleness: {partial_rollouts: true, lags: [1, 2, 4]}`), and every paired test, interval and
Pareto flag of the report applies to it unchanged. Unset fields follow the experiment's
`staleness` section; `lags` chooses a subset of `staleness.lags` (a partial-rollout arm has
nothing to interrupt at lag 0), so the grid runs only the cells the study needs.

Like `dynamic_sampling_rounds`, these are read by the harness (the grid, the generators) and the
learner (which versions its intake admits) alike. Imports no torch.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ArmStaleness(BaseModel):
    """What an arm changes in the experiment's `staleness` section (None: as the experiment)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lags: tuple[int, ...] | None = Field(
        default=None,
        min_length=1,
        description="The lags of staleness.lags this arm runs at (unset: all of them).",
    )
    partial_rollouts: bool | None = Field(
        default=None,
        description="staleness.partial_rollouts for this arm's trials (bounded mode only).",
    )
    sync_every: int | None = Field(
        default=None,
        ge=1,
        description="staleness.sync_every for this arm's trials: generators load new weights "
        "only every this many learner steps.",
    )

    @model_validator(mode="after")
    def _check_lags(self) -> ArmStaleness:
        lags = self.lags or ()
        if any(lag < 0 for lag in lags):
            raise ValueError(f"lags must be >= 0, got {list(lags)}")
        if len(set(lags)) != len(lags):
            raise ValueError(f"lags has duplicates: {list(lags)}; list each lag once")
        return self
