"""Settings of the comparison report (design section 8), one documented field each."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DivergedScores = Literal["zero_after", "exclude"]


class ReportConfig(BaseModel):
    """How the report turns trial metrics into scores, intervals and tests.

    Defaults follow Agarwal et al. 2021 ("Deep RL at the edge of the statistical precipice"):
    IQM with 95% stratified-bootstrap percentile intervals from 10,000 resamples.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    last_k_evals: int = Field(
        default=3,
        ge=1,
        description="Final score = mean of a trial's last K `eval/pass_rate` values. Averaging a "
        "few evals damps eval noise; a trial with fewer evals uses all it has.",
    )
    n_resamples: int = Field(
        default=10_000,
        ge=100,
        description="Bootstrap resamples for every table interval (Agarwal et al. 2021 use "
        "50,000; 10,000 keeps percentile endpoints stable to about 0.01 of a pass rate).",
    )
    curve_resamples: int = Field(
        default=2_000,
        ge=100,
        description="Bootstrap resamples per eval step for the learning-curve bands only (one "
        "bootstrap per step per arm and lag, so fewer than `n_resamples` keeps it fast).",
    )
    confidence: float = Field(
        default=0.95, gt=0.5, lt=1.0, description="Confidence level of every interval."
    )
    seed: int = Field(
        default=0,
        description="Seed of `np.random.default_rng` for every bootstrap; each interval restarts "
        "from it, so a number does not depend on the order the report computes things in.",
    )
    alpha: float = Field(
        default=0.05,
        gt=0.0,
        lt=1.0,
        description="Two-sided significance level for tests, the power analysis and the "
        "'cannot reach significance' notes.",
    )
    equivalence_margin: float = Field(
        default=0.02,
        gt=0.0,
        lt=1.0,
        description="Margin delta (score units: pass rate, for the final score and the AUC) of "
        "the equivalence and non-inferiority tests: 'X is not worse than Y by more than delta'. "
        "0.02 = 2 points of pass rate: well under the effects a staleness or algorithm study is "
        "run to find (AReaL's naive PPO lost 19 points at staleness 4), and a few times the SD "
        "of paired seed differences on the shipped 256-prompt evals (about 0.005-0.01), so 5 "
        "seeds can establish it when the arms are truly alike. Name your own for your task.",
    )
    target_power: float = Field(
        default=0.8,
        gt=0.0,
        lt=1.0,
        description="Power for the seeds-needed and smallest-detectable-effect analysis (80% is "
        "the conventional choice, Cohen 1988).",
    )
    pass_threshold: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Eval pass rate that counts as 'reached' for the time-to-threshold "
        "(Kaplan-Meier) analysis. Task dependent: set it between the initial and the best rate.",
    )
    spike_factor: float = Field(
        default=10.0,
        gt=1.0,
        description="A step is a gradient-norm spike when `optim/grad_norm` exceeds this factor "
        "times the median of the previous `spike_window` steps. Only used when the learner did "
        "not log `optim/grad_spikes` itself.",
    )
    spike_window: int = Field(
        default=20,
        ge=2,
        description="Trailing window (steps) of the running median for spike detection; no "
        "effect when `optim/grad_spikes` is logged.",
    )
    collapse_drop: float = Field(
        default=0.15,
        gt=0.0,
        le=1.0,
        description="A finished trial has collapsed when its final score is more than this "
        "below the best eval it reached (its own peak): the slow decline after an early peak "
        "that divergence (a non-finite or exploding loss) does not catch, and the failure the "
        "GSPO paper reports for GRPO on MoE models. A diverged trial scores 0, so it collapsed "
        "too once its peak was above this.",
    )
    diverged_scores: DivergedScores = Field(
        default="zero_after",
        description="How diverged trials enter score statistics: `zero_after` scores them as "
        "pass rate 0 from the step after their last logged step to `steps_planned` (final "
        "score 0, AUC over the full planned span): keeps the seed, avoids survivorship bias "
        "and never credits steps a trial did not run; `exclude` drops them from scores (they "
        "still count in the divergence rate).",
    )
    curve_points: int = Field(
        default=100,
        ge=10,
        description="Per-step curves (clip fraction, KL) are averaged into at most this many "
        "step bins before aggregating across seeds, to keep figures and summary small.",
    )
    figure_dpi: int = Field(default=110, ge=50, le=400, description="Resolution of PNG figures.")
    make_figures: bool = Field(
        default=True,
        description="Draw the PNG figures. False gives a tables-only report in about half the "
        "time (quick looks, tests); every number is still in the tables and summary.",
    )

    @model_validator(mode="after")
    def _check(self) -> ReportConfig:
        if self.curve_resamples > self.n_resamples:
            raise ValueError(
                f"curve_resamples={self.curve_resamples} exceeds n_resamples={self.n_resamples}; "
                "lower curve_resamples (the band is a visual aid, the tables use n_resamples)"
            )
        return self
