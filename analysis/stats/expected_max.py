"""Expected validation performance: the best score to expect after tuning with n configurations.

An equal tuning budget per arm is not enough to compare arms fairly: an arm can win at 3 tried
configurations and lose at 30 (Dodge et al. 2019, "Show Your Work: Improved Reporting of
Experimental Results", EMNLP). So the report shows, for each arm, the expected maximum
validation score over n randomly chosen configurations as a curve in n, estimated from the N
configurations actually tried (`expected_max_curve`), which arm leads at each budget
(`budget_ranking`), and how the score depends on each hyperparameter (`sensitivity_table`).

Two estimators of E[max of n draws], both weighted sums of the ascending order statistics
v_(1) <= ... <= v_(N) (a subset's max is the value at its largest sorted index, so ties need no
special care):

- "unbiased" (the default): the U-statistic, the average over all C(N, n) subsets of size n
  (without replacement) of the subset's max, weights C(i-1, n-1) / C(N, n). Dodge et al. 2021
  ("Expected Validation Performance and Estimation of a Random Variable's Maximum", Findings of
  EMNLP) show it is unbiased for E[max of n draws], while the 2019 estimator is biased low
  for n close to N (it keeps drawing the same few configurations again); defined for n <= N.
- "empirical": Dodge et al. 2019, n i.i.d. draws with replacement from the empirical CDF,
  weights (i/N)^n - ((i-1)/N)^n; defined for every n >= 1 and tends to max(v) as n grows.

The variance is the variance of the max under the same weights (of the subset max, or of the
max of n resampled draws): the spread of the tuned score across tuning runs, the band of the
EVP plot. It is not the sampling variance of the estimate itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd

from analysis.stats.bootstrap import MIN_RUNS, BootstrapSpec, stratified_bootstrap
from analysis.stats.metrics import pooled_mean

Estimator = Literal["unbiased", "empirical"]
ESTIMATORS: tuple[Estimator, ...] = ("unbiased", "empirical")
ONE_SEED_NOTE = "1 seed: interval collapsed to the point (resampling needs at least 2 seeds)"


def _sorted_scores(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """The scores ascending, checked: 1-D, non-empty, all finite."""
    arr = np.asarray(scores, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"scores must be 1-D (one score per configuration), got {arr.shape}")
    if arr.size == 0:
        raise ValueError("scores is empty: the expected max needs at least one configuration")
    if not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).sum())
        raise ValueError(
            f"scores has {bad} NaN/inf value(s) of {arr.size}; decide how failed configurations "
            "count (drop them, or give them the worst score) before estimating the expected max"
        )
    return np.sort(arr)


def _check_estimator(estimator: str) -> None:
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")


def _check_budget(n: int, n_scores: int, estimator: str) -> None:
    if isinstance(n, bool) or int(n) != n:
        raise ValueError(f"budget n must be an integer, got {n!r}")
    if n < 1:
        raise ValueError(f"budget n must be >= 1, got {n}")
    if estimator == "unbiased" and n > n_scores:
        raise ValueError(
            f"the unbiased estimator needs n <= N: n={n} configurations but only N={n_scores} "
            "were tried (use estimator='empirical' to extrapolate)"
        )


def _unbiased_weights(n_scores: int, n: int) -> np.ndarray:
    """P(the subset max is v_(i)) for a uniform size-n subset: C(i-1, n-1) / C(N, n).

    Never forms a binomial coefficient (C(1100, 550) overflows a float): from w_N = n / N down,
    w_(i-1) = w_i * (i - n) / (i - 1), a cumulative product of ratios in (0, 1], so nothing
    overflows, small weights underflow harmlessly to 0, and each weight carries at most about
    N rounding errors (relative 1e-13 at N = 1000; checked against exact integers in tests).
    O(N) per budget, O(N^2) for a whole curve.
    """
    weights = np.zeros(n_scores)
    j = np.arange(n_scores, n, -1, dtype=float)  # N, N-1, ..., n+1
    descending = (n / n_scores) * np.concatenate(([1.0], np.cumprod((j - n) / (j - 1))))
    weights[n - 1 :] = descending[::-1]  # C(i-1, n-1) = 0 below i = n
    return weights


def _empirical_weights(n_scores: int, n: int) -> np.ndarray:
    """P(max of n draws with replacement is v_(i)): (i/N)^n - ((i-1)/N)^n.

    Written as (i/N)^n * (1 - (1 - 1/i)^n) with expm1/log1p, so each weight keeps its relative
    precision (no subtraction of two nearly equal powers when n is large).
    """
    i = np.arange(1, n_scores + 1, dtype=float)
    top = np.exp(n * np.log(i / n_scores))
    weights = top.copy()  # i = 1: (1/N)^n, nothing below it
    weights[1:] = top[1:] * -np.expm1(n * np.log1p(-1.0 / i[1:]))
    return weights


def _weights(n_scores: int, n: int, estimator: str) -> np.ndarray:
    if estimator == "unbiased":
        return _unbiased_weights(n_scores, n)
    return _empirical_weights(n_scores, n)


def _moments(ordered: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """Mean and variance of the max under `weights` over the order statistics.

    Both are taken about the smallest score: mean = v_(1) + sum w_i (v_i - v_(1)), so a set of
    tied scores (and N = 1) gives exactly that score whatever the rounding of the weights, and
    a large common offset costs no precision. The variance is sum w_i (v_i - mean)^2, equal to
    E[max^2] - E[max]^2 (the weights sum to 1) without its cancellation, never negative.
    """
    low = ordered[0]
    mean = float(low + weights @ (ordered - low))
    variance = float(weights @ (ordered - mean) ** 2)
    return mean, variance


def expected_max(
    scores: Sequence[float] | np.ndarray, n: int, *, estimator: Estimator = "unbiased"
) -> float:
    """Expected best validation score after trying `n` of the configurations behind `scores`.

    `scores` is one validation score per tried configuration (N of them). "unbiased" (default)
    averages the max over all size-n subsets (n <= N); "empirical" is Dodge et al. 2019's
    max of n draws with replacement (any n >= 1). Raises ValueError for empty or non-finite
    scores, n < 1, or n > N with the unbiased estimator.
    """
    _check_estimator(estimator)
    ordered = _sorted_scores(scores)
    _check_budget(n, len(ordered), estimator)
    return _moments(ordered, _weights(len(ordered), int(n), estimator))[0]


def _frozen(values: np.ndarray) -> np.ndarray:
    out = np.array(values)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class ExpectedMaxCurve:
    """Expected max (and the variance of the max) at every budget 1..N of one arm.

    Arrays are read-only. `eq=False`: equality is identity (comparing arrays field by field
    has no single truth value).
    """

    budgets: np.ndarray  # 1..N, int
    mean: np.ndarray  # expected max at each budget
    variance: np.ndarray  # variance of the max at each budget
    estimator: str
    n_configurations: int

    def __post_init__(self) -> None:
        _check_estimator(self.estimator)
        shapes = {np.shape(self.budgets), np.shape(self.mean), np.shape(self.variance)}
        if shapes != {(self.n_configurations,)}:
            raise ValueError(
                f"budgets, mean and variance must each have n_configurations="
                f"{self.n_configurations} entries, got shapes {sorted(shapes)}"
            )
        for name in ("budgets", "mean", "variance"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    @property
    def std(self) -> np.ndarray:
        """Standard deviation of the max at each budget (the +-1 std band of the EVP plot)."""
        return np.sqrt(self.variance)


def expected_max_curve(
    scores: Sequence[float] | np.ndarray, *, estimator: Estimator = "unbiased"
) -> ExpectedMaxCurve:
    """The expected-max curve of one arm at budgets 1..N (N = number of scores).

    At n = 1 both estimators give the sample mean (variance: the population variance of the
    scores); at n = N the unbiased one gives the max with variance 0. Both are non-decreasing
    in n. Same input checks as `expected_max`.
    """
    _check_estimator(estimator)
    ordered = _sorted_scores(scores)
    n_scores = len(ordered)
    moments = [_moments(ordered, _weights(n_scores, n, estimator)) for n in range(1, n_scores + 1)]
    return ExpectedMaxCurve(
        budgets=np.arange(1, n_scores + 1),
        mean=np.array([m for m, _ in moments]),
        variance=np.array([v for _, v in moments]),
        estimator=estimator,
        n_configurations=n_scores,
    )


class LeaderChange(NamedTuple):
    """The sole leader differs from the previous sole leader from `budget` on."""

    budget: int
    previous_leader: str
    new_leader: str


@dataclass(frozen=True)
class BudgetRanking:
    """Which arm has the highest expected max at each budget 1..min N over arms.

    `leaders[k]` are the arms leading at `budgets[k]`, sorted by name: more than one when they
    tie exactly (within `atol`). A tie is not a change of leader: `changes` compares each sole
    leader with the previous sole leader, skipping tied budgets, and reports the first budget
    at which the new arm leads alone. `ties` lists every tied budget with its arms.
    """

    budgets: tuple[int, ...]
    leaders: tuple[tuple[str, ...], ...]
    changes: tuple[LeaderChange, ...]
    ties: tuple[tuple[int, tuple[str, ...]], ...]

    @property
    def winner_changes(self) -> bool:
        """True when the arm leading alone is not the same at every budget."""
        return bool(self.changes)

    def note(self) -> str:
        """One sentence for the report ("" when the winner never changes)."""
        if not self.changes:
            return ""
        first = self.changes[0].previous_leader
        steps = ", ".join(f"{c.new_leader} from {c.budget}" for c in self.changes)
        return (
            f"The winner changes with the budget: {first} leads at budget {self.budgets[0]}, "
            f"then {steps} configurations tried."
        )


def budget_ranking(curves: Mapping[str, ExpectedMaxCurve], *, atol: float = 0.0) -> BudgetRanking:
    """The leading arm at each budget 1..min N and the budgets at which the leader changes.

    Budgets stop at the smallest N of any arm: the unbiased curve does not exist beyond it,
    and comparing an extrapolated empirical curve with a measured one would not be like with
    like. Arms whose expected max is within `atol` of the best at a budget tie (default 0:
    exact ties only). All curves must use the same estimator.
    """
    if not curves:
        raise ValueError("budget_ranking needs at least one arm's curve")
    estimators = {curve.estimator for curve in curves.values()}
    if len(estimators) > 1:
        raise ValueError(f"curves mix estimators {sorted(estimators)}; compare like with like")
    if atol < 0:
        raise ValueError(f"atol must be >= 0, got {atol}")
    arms = sorted(curves)
    n_max = min(curves[arm].n_configurations for arm in arms)
    leaders: list[tuple[str, ...]] = []
    changes: list[LeaderChange] = []
    ties: list[tuple[int, tuple[str, ...]]] = []
    sole: str | None = None
    for budget in range(1, n_max + 1):
        values = {arm: float(curves[arm].mean[budget - 1]) for arm in arms}
        best = max(values.values())
        top = tuple(arm for arm in arms if values[arm] >= best - atol)
        leaders.append(top)
        if len(top) > 1:
            ties.append((budget, top))
            continue
        if sole is not None and top[0] != sole:
            changes.append(LeaderChange(budget, sole, top[0]))
        sole = top[0]
    return BudgetRanking(
        budgets=tuple(range(1, n_max + 1)),
        leaders=tuple(leaders),
        changes=tuple(changes),
        ties=tuple(ties),
    )


SENSITIVITY_COLUMNS = ["arm", "param", "value", "mean", "low", "high", "n_seeds", "note"]


def _check_frame(frame: pd.DataFrame, needed: list[str], score_col: str) -> None:
    missing = [col for col in needed if col not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks column(s) {missing}; it has {list(frame.columns)}")
    if frame.empty:
        raise ValueError("frame has no tuning trials")
    scores = pd.to_numeric(frame[score_col], errors="coerce").to_numpy(dtype=float)
    if not np.isfinite(scores).all():
        raise ValueError(
            f"column {score_col!r} has non-numeric, NaN or inf scores; decide how failed "
            "trials count before the sensitivity table"
        )


def sensitivity_table(
    frame: pd.DataFrame,
    *,
    arm_col: str = "arm",
    param_cols: Sequence[str],
    seed_col: str = "seed",
    score_col: str = "score",
    confidence: float = 0.95,
    seed: int = 0,
    n_resamples: int = 10_000,
) -> pd.DataFrame:
    """Mean score at each value of each hyperparameter, per arm, with a bootstrap interval.

    One row per (arm, hyperparameter, value). The score is averaged first over the trials of
    one tuning seed that share the value (the other hyperparameters and repeats), then across
    seeds, so every seed counts once however many trials it ran. The interval is a percentile
    bootstrap over those per-seed means (seeds are the independent units), from the report's
    one engine: `stratified_bootstrap` with a single group and a fresh
    `default_rng(seed)` per row. With one seed there is nothing to resample: low = high = mean
    and `note` says so. Trials whose value of a hyperparameter is missing (NaN: the arm does
    not have it) give no rows for it.
    """
    params = list(param_cols)
    if not params:
        raise ValueError("param_cols is empty: name at least one hyperparameter column")
    _check_frame(frame, [arm_col, *params, seed_col, score_col], score_col)
    spec = BootstrapSpec(n_resamples=n_resamples, confidence=confidence, seed=seed)
    rows = []
    for arm, trials in frame.groupby(arm_col, sort=True):
        for param in params:
            per_value = trials.groupby([param, seed_col], sort=True)[score_col].mean()
            for value, by_seed in per_value.groupby(level=0, sort=True):
                seed_means = by_seed.to_numpy(dtype=float)
                point = float(seed_means.mean())
                if len(seed_means) < MIN_RUNS:
                    low, high, note = point, point, ONE_SEED_NOTE
                else:
                    lo, hi = stratified_bootstrap([seed_means], pooled_mean, spec)
                    low, high, note = float(lo), float(hi), ""
                rows.append((arm, param, value, point, low, high, len(seed_means), note))
    return pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS)
