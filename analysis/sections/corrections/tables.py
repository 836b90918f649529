"""Rows of section "Off-policy corrections and staleness": per-trial reductions, then per cell.

Corrections x lag: scores, correction diagnostics, staleness accounting, MoE routing.

A correction (`grpo_naive`, `grpo_tis_seq`, ...) is an arm, so "correction x lag" is the report's
(arm, lag) grid. Every statistic is one number per trial (a mean over its logged steps, a sum, or
the run-level bias below), then the mean across seeds with the report's bootstrap interval, as in
the stability section: seeds, not steps, are the replicates. All rows go to summary section
`corrections`; a statistic no trial measured is left out, so no table is empty.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.sections.base import Measure, measure_rows
from analysis.stats import BootstrapSpec
from analysis.trial_scores import finished, reduce_metric
from contract import metrics as mn

SECTION = "corrections"

# Per-trial mean over steps of each metric (finite steps only: NaN means "not measured").
STEP_MEANS = {
    "ess_frac": mn.OFFPOLICY_ESS_FRAC,
    "clip_frac": mn.POLICY_CLIP_FRAC,
    "weight_mean": mn.OFFPOLICY_WEIGHT_MEAN,
    "masked_frac": mn.OFFPOLICY_MASKED_FRAC,
    "trunc_frac": mn.OFFPOLICY_TRUNC_FRAC,
    "kl_staleness": mn.STALENESS_KL_BEHAVIOR,
    "kl_engine": mn.MISMATCH_KL_BEHAVIOR,
    "staleness_mean": mn.STALENESS_MEAN,
    "generation_s": mn.STALENESS_GENERATION_S,
    "queue_s": mn.STALENESS_QUEUE_S,
    "age_s": mn.STALENESS_AGE_S,
    "routing_change_frac": mn.MOE_ROUTING_CHANGE_FRAC,
    "token_rerouted_frac": mn.MOE_TOKEN_REROUTED_FRAC,
    "rollout_routing_mismatch": mn.MOE_ROLLOUT_ROUTING_MISMATCH,
    "rollout_token_rerouted_frac": mn.MOE_ROLLOUT_TOKEN_REROUTED_FRAC,
    "logratio_var": mn.MOE_LOGRATIO_VAR,
    "routing_logratio_var": mn.MOE_ROUTING_LOGRATIO_VAR,
    "routing_logratio_var_frac": mn.MOE_ROUTING_LOGRATIO_VAR_FRAC,
}

# The report's tables of this section: statistics in column order, and the statistics whose
# presence makes the table worth showing (clip fraction and the engine KL are logged by every
# run and already in the stability section; here they ride along with the correction metrics).
SCORE_STATS = ("final_score_iqm", "auc_iqm")
OFFPOLICY_STATS = (
    "ess_frac",
    "clip_frac",
    "weight_mean",
    "masked_frac",
    "trunc_frac",
    "kl_staleness",
    "kl_engine",
)
OFFPOLICY_TRIGGERS = ("ess_frac", "weight_mean", "masked_frac", "trunc_frac", "kl_staleness")
STALENESS_STATS = (
    "staleness_mean",
    "generation_s",
    "queue_s",
    "age_s",
    "dropped_total",
    "dropped_frac",
    "bias_reward",
    "bias_length",
)
MOE_STATS = (
    "routing_change_frac",
    "token_rerouted_frac",
    "rollout_routing_mismatch",
    "rollout_token_rerouted_frac",
    "logratio_var",
    "routing_logratio_var",
    "routing_logratio_var_frac",
)

# (trained mean, dropped mean, per-step bias) of each quantity whose selection bias is reported.
BIAS_COLUMNS = {
    "bias_reward": (mn.REWARD_MEAN, mn.STALENESS_DROPPED_REWARD_MEAN, mn.STALENESS_BIAS_REWARD),
    "bias_length": (mn.LENGTH_MEAN, mn.STALENESS_DROPPED_LENGTH_MEAN, mn.STALENESS_BIAS_LENGTH),
}


def column(trial: pd.DataFrame, name: str) -> np.ndarray:
    """Metric `name` of one trial's step table as floats; all NaN when it was never logged."""
    if name not in trial.columns:
        return np.full(len(trial), np.nan)
    return trial[name].to_numpy(dtype=float)


def groups_per_step(trial: pd.DataFrame) -> float:
    """Groups the learner trained per step (`learner.prompts_per_step`, P), from the metrics.

    The learner logs it as `groups/trained` (the median over steps: a step that refused poison
    groups trains fewer). Trials logged before that metric existed: analysis reads nothing but
    the contract (design section 2), and the contract pins P anyway: per step
    `staleness/bias_x` = T - (P T + d D) / (P + d) = d (T - D) / (P + d), for trained mean T,
    d dropped groups of mean D; so P = d (T - D) / bias - d at any step that dropped groups
    whose mean differs from the trained one. Reward and length both give estimates (length,
    in tokens, differs by whole tokens and so pins P to many digits); the median, rounded to a
    whole group count, resists a step whose bias is too small to divide by. NaN when no step
    identifies P (no drops, or drops never differing from the trained groups).
    """
    counted = column(trial, mn.GROUPS_TRAINED)
    counted = counted[np.isfinite(counted)]
    if len(counted):  # logged by the learner since groups/trained exists: no inference needed
        return float(np.median(counted))
    estimates = []
    for trained, dropped_mean, bias in BIAS_COLUMNS.values():
        d, t = column(trial, mn.STALENESS_DROPPED), column(trial, trained)
        dm, b = column(trial, dropped_mean), column(trial, bias)
        with np.errstate(invalid="ignore"):
            gap = np.abs(t - dm)
            ok = np.isfinite(d + t + dm + b) & (d > 0) & (b != 0)
            ok &= gap > 1e-9 * (np.abs(t) + np.abs(dm))  # T = D: bias is rounding noise
        estimates.append(d[ok] * (t[ok] - dm[ok]) / b[ok] - d[ok])
    p = np.concatenate(estimates)
    if len(p) == 0:
        return math.nan
    p = float(np.round(np.median(p)))
    return p if p >= 1 else math.nan


def run_bias(
    trained: np.ndarray, dropped: np.ndarray, dropped_mean: np.ndarray, per_step: float
) -> float:
    """Run-level selection bias: trained mean - mean over every group read (trained + dropped).

    Per step k the learner trains P = `per_step` groups of mean T_k (`reward/mean`: groups hold
    equal sample counts, so the sample mean is the group mean) and drops d_k groups of mean D_k.
    Over the run, n steps train N = n P groups of mean mean(T), and the groups read have mean
        A = (N mean(T) + sum_k d_k D_k) / (N + sum_k d_k),
    so the bias is mean(T) - A = sum_k d_k (mean(T) - D_k) / (N + sum_k d_k). This compares the
    dropped groups with the run's trained mean; averaging the per-step `staleness/bias_*` would
    compare each with its own step's and, unweighted by groups read (P + d_k), miscount the
    steps that dropped many. Steps with no trained mean are not training steps (an initial
    eval row); a drop without a logged mean cannot enter the read mean. No drops: exactly 0,
    whatever P; drops never counted (all NaN): NaN.
    """
    if not np.isfinite(dropped).any():
        return math.nan  # drops never counted: the bias is unknown, not 0
    trained = trained[np.isfinite(trained)]
    known = np.isfinite(dropped) & np.isfinite(dropped_mean) & (dropped > 0)
    d, dm = dropped[known], dropped_mean[known]
    if len(trained) == 0:
        return math.nan
    if d.sum() == 0:
        return 0.0
    n_trained = len(trained) * per_step  # NaN P gives NaN: the weighting is unknown
    return float(np.sum(d * (trained.mean() - dm)) / (n_trained + d.sum()))


def dropped_fraction(trial: pd.DataFrame, per_step: float) -> float:
    """Share of the groups read that were dropped as stale: sum d / (n P + sum d)."""
    d = column(trial, mn.STALENESS_DROPPED)
    d = d[np.isfinite(d)]
    if len(d) == 0:
        return math.nan
    if d.sum() == 0:
        return 0.0
    n = int(np.isfinite(column(trial, mn.REWARD_MEAN)).sum())
    return float(d.sum() / (n * per_step + d.sum()))


def trial_reductions(trial: pd.DataFrame) -> dict[str, float]:
    """Every per-trial number of this section for one trial's step table."""
    out = {stat: reduce_metric(trial, name, "mean") for stat, name in STEP_MEANS.items()}
    dropped = column(trial, mn.STALENESS_DROPPED)
    out["dropped_total"] = float(np.nansum(dropped)) if np.isfinite(dropped).any() else math.nan
    per_step = groups_per_step(trial)
    out["dropped_frac"] = dropped_fraction(trial, per_step)
    for stat, (trained, dropped_mean, _) in BIAS_COLUMNS.items():
        out[stat] = run_bias(column(trial, trained), dropped, column(trial, dropped_mean), per_step)
    return out


def correction_trials(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """`trials` (rows of `score_trials`) with one column per statistic of `trial_reductions`."""
    by_trial = dict(tuple(metrics.groupby("trial_name", sort=False))) if len(metrics) else {}
    empty = pd.DataFrame(columns=[mn.STEP])
    rows = [trial_reductions(by_trial.get(name, empty)) for name in trials["trial_name"]]
    reduced = pd.DataFrame(rows, index=trials.index)
    return pd.concat([trials, reduced], axis=1)


def shows(scores: pd.DataFrame) -> bool:
    """True when the section has an axis to show: the trials ran several lags, or an arm
    applies an off-policy correction (`correction` of `loading.Experiment.trials`). At a single
    lag without a correction every arm is plain on- (or equally off-) policy training, and the
    diagnostics here (ESS 1, nothing dropped) restate the arms' setup, not a finding."""
    if scores.empty:
        return False
    corrected = scores.get("correction", pd.Series(dtype=str)).fillna("").astype(str) != ""
    return scores["lag"].nunique() > 1 or bool(corrected.any())


def _stat_rows(trials: pd.DataFrame, stats: tuple[str, ...], spec: BootstrapSpec) -> list[dict]:
    """Mean across seeds with interval of each statistic, per (arm, lag) that measured it."""
    return measure_rows(trials, SECTION, [Measure(stat) for stat in stats], spec)


def _measured(trials: pd.DataFrame, stats: tuple[str, ...]) -> bool:
    return bool(np.isfinite(trials[list(stats)].to_numpy(dtype=float)).any())


def score_rows(scored: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Final score and AUC per (arm, lag): IQM across seeds with the usual interval."""
    measures = [Measure("final_score_iqm", "iqm", "final_score"), Measure("auc_iqm", "iqm", "auc")]
    return measure_rows(scored, SECTION, measures, spec)


def correction_rows(metrics: pd.DataFrame, scores: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `corrections`; without a lag or correction axis (`shows`) only the MoE routing
    table, when the trials measured it (how much routing moves is a finding at any lag).

    Scores use the scored trials (as the Scores section); the diagnostics use the finished
    ones (completed or diverged, as the stability section): a diverged trial's steps were run.
    """
    if not shows(scores):
        done = finished(scores)
        if done.empty:
            return []
        reduced = correction_trials(metrics, done)
        return _stat_rows(reduced, MOE_STATS, spec) if _measured(reduced, MOE_STATS) else []
    rows = score_rows(scores[scores["scored"]], spec)
    done = finished(scores)
    if done.empty:
        return rows
    reduced = correction_trials(metrics, done)
    if _measured(reduced, OFFPOLICY_TRIGGERS):
        rows += _stat_rows(reduced, OFFPOLICY_STATS, spec)
    for stats in (STALENESS_STATS, MOE_STATS):
        if _measured(reduced, stats):
            rows += _stat_rows(reduced, stats, spec)
    return rows
