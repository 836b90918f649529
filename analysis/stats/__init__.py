"""The statistics core of the report: metrics, one bootstrap engine, and tests on top.

Shaped like rliable (Agarwal et al. 2021): every metric is a function of one runs x groups score
matrix (`metrics`: IQM, mean, median, optimality gap, probability of improvement, performance
profile), and every interval of the report comes from one stratified bootstrap
(`bootstrap.stratified_bootstrap`, a seeded `numpy.random.Generator` per interval, never the
global state). `intervals` gives the estimate-with-interval shapes the report uses; hypothesis
tests and effect sizes (`significance`), power analysis (`power`), Kaplan-Meier (`survival`)
and count intervals (`proportions`) sit beside them.
"""

from analysis.stats.bootstrap import (
    BootstrapSpec,
    Interval,
    percentile_interval,
    resample,
    stratified_bootstrap,
)
from analysis.stats.expected_max import (
    ESTIMATORS,
    BudgetRanking,
    Estimator,
    ExpectedMaxCurve,
    LeaderChange,
    budget_ranking,
    expected_max,
    expected_max_curve,
    sensitivity_table,
)
from analysis.stats.intervals import (
    AGGREGATE_NAMES,
    IQM_IS_MEAN_NOTE,
    MIN_SEEDS_NOTE,
    Aggregate,
    AggregateName,
    aggregate_interval,
    paired_mean_difference,
    performance_profile,
    poi_interval,
    stratified_aggregate,
    stratified_interval,
)
from analysis.stats.metrics import (
    METRICS,
    Scores,
    columns,
    iqm,
    iqm_is_mean,
    mean,
    median,
    optimality_gap,
    pairwise_improvement,
    pooled_mean,
    probability_of_improvement,
    profile_values,
)
from analysis.stats.proportions import wilson

__all__ = [
    "AGGREGATE_NAMES",
    "ESTIMATORS",
    "IQM_IS_MEAN_NOTE",
    "METRICS",
    "MIN_SEEDS_NOTE",
    "Aggregate",
    "AggregateName",
    "BootstrapSpec",
    "BudgetRanking",
    "Estimator",
    "ExpectedMaxCurve",
    "Interval",
    "LeaderChange",
    "Scores",
    "aggregate_interval",
    "budget_ranking",
    "columns",
    "expected_max",
    "expected_max_curve",
    "iqm",
    "iqm_is_mean",
    "mean",
    "median",
    "optimality_gap",
    "paired_mean_difference",
    "pairwise_improvement",
    "percentile_interval",
    "performance_profile",
    "poi_interval",
    "pooled_mean",
    "probability_of_improvement",
    "profile_values",
    "resample",
    "sensitivity_table",
    "stratified_aggregate",
    "stratified_bootstrap",
    "stratified_interval",
    "wilson",
]
