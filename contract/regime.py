"""A trial's resolved staleness regime, as its `trial.json` records it for every reader.

The regime is resolved once, when the trial is prepared (`harness.staleness_regimes.arm_regime`:
the experiment's `staleness` section with the arm's own fields on top), and written into the
record; the report reads it from there instead of re-deriving it from the resolved config's
YAML, so the two cannot disagree about an arm's partial rollouts or sync interval.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from contract.trial import StalenessMode


class TrialRegime(BaseModel):
    """How one trial's groups were made and admitted (design section 5)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: StalenessMode = Field(description="fixed: exactly `lag` versions old; bounded: at most.")
    lag: int = Field(strict=True, ge=0, description="The lag (fixed) or max lag (bounded).")
    partial_rollouts: bool = Field(
        default=False, description="In-flight responses continued on newer weights (bounded)."
    )
    sync_every: int = Field(
        default=1, strict=True, ge=1, description="Generators load weights every k steps."
    )
    correction: str = Field(
        default="", description="The arm's off-policy correction; empty when it applies none."
    )

    def words(self) -> str:
        """The regime as the report's `policy` column says it (`regime_words`)."""
        return regime_words(self.mode, self.lag, self.sync_every, self.partial_rollouts)


def regime_words(mode: str, lag: int, sync_every: int, partial: bool = False) -> str:
    """The staleness policy of a trial in words: its mode and lag (admission control and, in
    bounded mode, dropping), partial rollouts (in-flight responses continued on new weights),
    and the weight-sync interval when generators sync less often."""
    words = f"fixed lag {lag}" if mode == "fixed" else f"bounded, max lag {lag}"
    words += ", partial rollouts" if partial else ""
    return words + (f", weights synced every {sync_every} steps" if sync_every > 1 else "")
