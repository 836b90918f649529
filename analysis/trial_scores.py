"""One number per trial for each quantity the report aggregates across seeds.

Every statistic downstream works on these per-trial scalars (one per seed), never on raw steps,
because seeds, not steps, are the independent replicates (Agarwal et al. 2021, sec. 3).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.config import ReportConfig
from analysis.loading import Experiment
from analysis.wall_clock import startup_s
from contract import metrics as mn

SCORE_COLUMNS = [
    "final_score",
    "auc",
    "n_evals",
    "time_to_threshold",
    "reached_threshold",
    "steps_per_s",
    "learner_wait_frac",
    "gen_idle_frac",
    "token_lag_mean",  # versions between a response token's sampler and its learner step
    "kl_behavior_mean",  # k3 KL of stale behaviour policies from the learner (staleness/)
    "grad_spike_rate",
    "max_kl_old",
    "clip_frac_mean",
    "peak_score",  # the best eval the trial reached
    "peak_drop",  # peak_score - final_score: how far it fell from its best
    "collapsed",  # 1.0 when peak_drop > ReportConfig.collapse_drop (NaN without evals)
    "startup_s",  # trial start to first learner update (analysis.wall_clock), off the curves
    "rewinds",  # bounded-mode resumes that rewound the trial (learner.runtime.resume)
    "rewind_lost_groups",  # groups those rewinds cost: trained and lost, or made and withdrawn
]


def eval_curve(trial: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(steps, pass rates) of the rows where `eval/pass_rate` was measured."""
    if mn.EVAL_PASS_RATE not in trial.columns:
        return np.array([], dtype=float), np.array([], dtype=float)
    rows = trial[np.isfinite(trial[mn.EVAL_PASS_RATE].to_numpy(dtype=float))]
    return rows[mn.STEP].to_numpy(dtype=float), rows[mn.EVAL_PASS_RATE].to_numpy(dtype=float)


def final_score(values: np.ndarray, last_k: int) -> float:
    """Mean of the last `last_k` evals (fewer if the trial has fewer); NaN with none."""
    return float(np.mean(values[-last_k:])) if len(values) else math.nan


def area_under_curve(steps: np.ndarray, values: np.ndarray) -> float:
    """Trapezoid area under the eval curve divided by its step span: the mean pass rate.

    Normalising by the span makes trials of different lengths comparable on the pass-rate
    scale; a single eval is its own mean.
    """
    if len(values) == 0:
        return math.nan
    span = steps[-1] - steps[0]
    if span <= 0:
        return float(values[-1])
    return float(np.trapezoid(values, steps) / span)


def diverged_curve(
    steps: np.ndarray, values: np.ndarray, last_step: float, steps_planned: float
) -> tuple[np.ndarray, np.ndarray]:
    """A diverged trial's eval curve as scored: its evals, then pass rate 0 to the planned end.

    The learner stops at the update that produced non-finite values, so the policy after its
    last logged step is unusable: the curve drops to 0 (linearly from the last eval, as between
    any two evals) at `last_step + 1` and stays 0 until `steps_planned`. Without a planned step
    count the curve ends at the drop.
    """
    drop = last_step + 1
    end = steps_planned if math.isfinite(steps_planned) else drop
    tail = np.unique([drop, max(drop, end)])  # (drop,) or (drop, planned end)
    return np.concatenate([steps, tail]), np.concatenate([values, np.zeros(len(tail))])


def time_to_threshold(
    steps: np.ndarray, values: np.ndarray, threshold: float
) -> tuple[float, bool]:
    """(first eval step with pass rate >= threshold, True) or (last eval step, False = censored)."""
    hit = np.flatnonzero(values >= threshold)
    if len(hit):
        return float(steps[hit[0]]), True
    return (float(steps[-1]) if len(steps) else math.nan), False


def learner_steps_per_s(trial: pd.DataFrame) -> float:
    """1 / median `perf/learner_step_s`; else steps per second of wall time between rows.

    The median resists the first step's compile/warm-up time dominating the rate.
    """
    if mn.PERF_LEARNER_STEP_S in trial.columns:
        step_s = trial[mn.PERF_LEARNER_STEP_S].to_numpy(dtype=float)
        step_s = step_s[np.isfinite(step_s) & (step_s > 0)]
        if len(step_s):
            return float(1.0 / np.median(step_s))
    stamps = trial[[mn.STEP, mn.TIMESTAMP]].dropna()
    if len(stamps) < 2:
        return math.nan
    wall = stamps[mn.TIMESTAMP].iloc[-1] - stamps[mn.TIMESTAMP].iloc[0]
    steps = stamps[mn.STEP].iloc[-1] - stamps[mn.STEP].iloc[0]
    return float(steps / wall) if wall > 0 else math.nan


def detect_spikes(grad_norm: np.ndarray, factor: float, window: int) -> np.ndarray:
    """Boolean per step: grad norm > factor x median of the previous `window` finite norms.

    A trailing median (not mean) so one spike does not raise the bar for the next; the first
    step has no history and is never a spike. Infinite norms count as spikes (design sec. 9
    treats them as divergence events); NaN means "not measured" and is dropped by the caller.
    """
    spikes = np.zeros(len(grad_norm), dtype=bool)
    for i in range(1, len(grad_norm)):
        if not np.isfinite(grad_norm[i]):
            spikes[i] = True
            continue
        history = grad_norm[max(0, i - window) : i]
        history = history[np.isfinite(history)]
        spikes[i] = len(history) > 0 and grad_norm[i] > factor * np.median(history)
    return spikes


def grad_spike_rate(trial: pd.DataFrame, factor: float, window: int) -> float:
    """Spikes per learner step, from `optim/grad_spikes` if logged, else detected from norms."""
    if mn.OPTIM_GRAD_SPIKES in trial.columns:
        counts = trial[mn.OPTIM_GRAD_SPIKES].to_numpy(dtype=float)
        counts = counts[np.isfinite(counts)]
        if len(counts):
            return float(counts.sum() / len(counts))
    if mn.OPTIM_GRAD_NORM not in trial.columns:
        return math.nan
    norms = trial[mn.OPTIM_GRAD_NORM].to_numpy(dtype=float)
    measured = norms[~np.isnan(norms)]
    if len(measured) == 0:
        return math.nan
    return float(detect_spikes(measured, factor, window).mean())


def reduce_metric(trial: pd.DataFrame, column: str, how: str) -> float:
    """Mean (or max) of a metric's finite values in one trial; NaN when none or never logged."""
    if column not in trial.columns:
        return math.nan
    values = trial[column].to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return math.nan
    return float(values.max() if how == "max" else values.mean())


def score_trial(
    trial: pd.DataFrame,
    config: ReportConfig,
    *,
    diverged: bool = False,
    steps_planned: float = math.nan,
    started_s: float = math.nan,
) -> dict[str, float]:
    """All per-trial scalars of one trial's step table (see SCORE_COLUMNS).

    A diverged trial never scores better than it ran: its final policy is the diverged one, so
    its final score is 0 (the pass-rate floor), and its AUC covers the whole planned span with
    pass rate 0 after divergence (`diverged_curve`). Time to threshold stays censored at its
    last eval. The other scalars describe the steps it did run.
    """
    steps, values = eval_curve(trial)
    t_hit, reached = time_to_threshold(steps, values, config.pass_threshold)
    final, auc = final_score(values, config.last_k_evals), area_under_curve(steps, values)
    if diverged and len(values):
        last_step = float(trial[mn.STEP].max())
        final = 0.0
        auc = area_under_curve(*diverged_curve(steps, values, last_step, steps_planned))
    return {
        "final_score": final,
        "auc": auc,
        "n_evals": float(len(values)),
        "time_to_threshold": t_hit,
        "reached_threshold": float(reached),
        "steps_per_s": learner_steps_per_s(trial),
        "learner_wait_frac": reduce_metric(trial, mn.PERF_LEARNER_WAIT_FRAC, "mean"),
        "gen_idle_frac": reduce_metric(trial, mn.PERF_GEN_IDLE_FRAC, "mean"),
        "token_lag_mean": reduce_metric(trial, mn.STALENESS_TOKEN_LAG_MEAN, "mean"),
        "kl_behavior_mean": reduce_metric(trial, mn.STALENESS_KL_BEHAVIOR, "mean"),
        "grad_spike_rate": grad_spike_rate(trial, config.spike_factor, config.spike_window),
        "max_kl_old": reduce_metric(trial, mn.POLICY_KL_OLD, "max"),
        "clip_frac_mean": reduce_metric(trial, mn.POLICY_CLIP_FRAC, "mean"),
        **peak_scores(values, final, config.collapse_drop),
        "startup_s": startup_s(trial, started_s),
        **rewind_counts(trial),
    }


def peak_scores(values: np.ndarray, final: float, collapse_drop: float) -> dict[str, float]:
    """The trial's best eval, how far its final score fell from it, and whether that fall is a
    collapse (more than `collapse_drop`). Taken against the scored final (0 for a diverged
    trial), so a collapse is judged on the policy the trial ends with."""
    if len(values) == 0 or not math.isfinite(final):
        return {"peak_score": math.nan, "peak_drop": math.nan, "collapsed": math.nan}
    peak = float(np.max(values))
    drop = peak - final
    return {"peak_score": peak, "peak_drop": drop, "collapsed": float(drop > collapse_drop)}


def rewind_counts(trial: pd.DataFrame) -> dict[str, float]:
    """How often a trial was rewound (a row with `rewind/withdrawn_versions`: the first step
    after each rewinding resume) and the groups that cost: lost with their steps plus dropped as
    made from withdrawn weights (0 and 0 for a trial never rewound, or logged before rewinds)."""

    def column(name: str) -> np.ndarray:
        if name not in trial.columns:
            return np.zeros(0)
        values = trial[name].to_numpy(dtype=float)
        return values[np.isfinite(values)]

    lost = column(mn.REWIND_LOST_GROUPS).sum() + column(mn.REWIND_WITHDRAWN_GROUPS).sum()
    return {
        "rewinds": float(len(column(mn.REWIND_WITHDRAWN_VERSIONS))),
        "rewind_lost_groups": float(lost),
    }


def condition_labels(trials: pd.DataFrame) -> pd.Series:
    """Arm label per trial; `arm (mode)` when an experiment mixes staleness modes.

    Fixed and bounded staleness are different treatments, so mixing them in one (arm, lag)
    cell would average incomparable runs.
    """
    if trials["mode"].nunique() > 1:
        return trials["arm"] + " (" + trials["mode"] + ")"
    return trials["arm"].copy()


def score_trials(experiment: Experiment, config: ReportConfig) -> pd.DataFrame:
    """One row per trial: identity, `scored` flag, and SCORE_COLUMNS.

    `scored` marks trials whose scores enter the across-seed statistics: completed trials, and
    diverged ones (scored 0 after divergence, see `score_trial`) unless
    `config.diverged_scores == "exclude"`; running or failed trials never.
    """
    trials = experiment.trials.copy()
    if trials.empty:
        return pd.DataFrame(columns=[*trials.columns, "scored", *SCORE_COLUMNS])
    trials["arm"] = condition_labels(trials)
    by_trial = dict(tuple(experiment.metrics.groupby("trial_name", sort=False)))
    rows = []
    for t in trials.itertuples(index=False):
        frame = by_trial.get(t.trial_name)
        if frame is None:
            rows.append(dict.fromkeys(SCORE_COLUMNS, math.nan))
            continue
        planned = math.nan if pd.isna(t.steps_planned) else float(t.steps_planned)
        started = math.nan if pd.isna(t.started_s) else float(t.started_s)
        rows.append(
            score_trial(
                frame,
                config,
                diverged=bool(t.diverged),
                steps_planned=planned,
                started_s=started,
            )
        )
    scores = pd.DataFrame(rows, columns=SCORE_COLUMNS, index=trials.index)
    completed = trials["status"].eq("completed") & ~trials["diverged"]
    diverged_ok = trials["diverged"] & (config.diverged_scores == "zero_after")
    trials["scored"] = (completed | diverged_ok) & scores["n_evals"].gt(0)
    return pd.concat([trials, scores], axis=1)


def finished(scores: pd.DataFrame) -> pd.DataFrame:
    """Trials that ran to an end (completed or diverged); stability statistics use these."""
    return scores[scores["status"].eq("completed") | scores["diverged"]]


def by_condition(scores: pd.DataFrame, column: str) -> dict[tuple[str, int], np.ndarray]:
    """{(arm, lag): finite values of `column` across seeds} for the given trial rows."""
    out = {}
    for (arm, lag), group in scores.groupby(["arm", "lag"], sort=True):
        values = group[column].to_numpy(dtype=float)
        out[(str(arm), int(lag))] = values[np.isfinite(values)]
    return out


def seed_values(scores: pd.DataFrame, column: str, arm: str, lag: int) -> pd.Series:
    """`column` per seed of one (arm, lag) cell; a seed run twice in the cell (a rerun under a
    new trial name) counts once, averaged."""
    cell = scores[(scores["arm"] == arm) & (scores["lag"] == lag)]
    return cell.groupby("seed")[column].mean()


def paired_by_seed(x: pd.Series, y: pd.Series) -> pd.DataFrame:
    """Two cells' per-seed values inner-joined on seed (columns x, y), seeds in order."""
    pairs = pd.concat([x.rename("x"), y.rename("y")], axis=1, join="inner").dropna()
    return pairs.sort_index()


def matched(scores: pd.DataFrame, column: str, arm_x: str, arm_y: str, lag: int) -> pd.DataFrame:
    """Per-seed values of two arms at one lag, inner-joined on seed (columns x, y)."""
    return paired_by_seed(
        seed_values(scores, column, arm_x, lag), seed_values(scores, column, arm_y, lag)
    )
