"""The one place metric names live (design section 7), with the rule that combines each one.

Every producer (learner, generator, buffer) and every consumer (analysis, MLflow logging) imports
names from here, so a typo is an ImportError instead of a silently empty column. The names are the
Parquet column names and the MLflow metric keys. `REDUCTIONS` says how partial measurements of one
step combine (minibatch updates, data-parallel ranks, generators); `combine` applies it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final, Literal

# Identity columns present in every row of a trial's metrics.parquet.
STEP: Final = "step"
TIMESTAMP: Final = "timestamp"

REWARD_MEAN: Final = "reward/mean"
REWARD_STD: Final = "reward/std"
REWARD_GROUP_STD_MEAN: Final = "reward/group_std_mean"
GROUPS_ZERO_ADV_FRAC: Final = "groups/zero_adv_frac"
EVAL_PASS_RATE: Final = "eval/pass_rate"

POLICY_KL_OLD: Final = "policy/kl_old"
POLICY_KL_REF: Final = "policy/kl_ref"
POLICY_CLIP_FRAC: Final = "policy/clip_frac"
POLICY_CLIP_FRAC_SEQ: Final = "policy/clip_frac_seq"
POLICY_CLIP_FRAC_LOW: Final = "policy/clip_frac_low"
POLICY_CLIP_FRAC_HIGH: Final = "policy/clip_frac_high"
# ratio_mean/min/max: the ratio the objective clips, in its own units (GSPO: sequence ratios
# s_i; GSPO-token: s_i,t per token; GRPO/PPO: r_t per token); ratio_mean is kept for earlier
# reports but is not comparable across arms. ratio_seq_mean (mean over sequences of
# exp(mean_t log r_t)) and ratio_token_mean (token mean of r_t) are, for every objective
# (learner.objectives.stats).
POLICY_RATIO_MEAN: Final = "policy/ratio_mean"
POLICY_RATIO_MIN: Final = "policy/ratio_min"
POLICY_RATIO_MAX: Final = "policy/ratio_max"
POLICY_RATIO_SEQ_MEAN: Final = "policy/ratio_seq_mean"
POLICY_RATIO_TOKEN_MEAN: Final = "policy/ratio_token_mean"
POLICY_ENTROPY: Final = "policy/entropy"
POLICY_LOSS: Final = "policy/loss"

OPTIM_GRAD_NORM: Final = "optim/grad_norm"
OPTIM_LR: Final = "optim/lr"
OPTIM_GRAD_SPIKES: Final = "optim/grad_spikes"

LENGTH_MEAN: Final = "length/mean"
LENGTH_P95: Final = "length/p95"
LENGTH_TRUNCATED_FRAC: Final = "length/truncated_frac"

STALENESS_MEAN: Final = "staleness/mean"
STALENESS_MAX: Final = "staleness/max"

BUFFER_DEPTH: Final = "buffer/depth"
BUFFER_DROPPED_STALE: Final = "buffer/dropped_stale"
BUFFER_DEAD_LETTER: Final = "buffer/dead_letter"

MISMATCH_KL_BEHAVIOR: Final = "mismatch/kl_behavior"
MISMATCH_IS_WEIGHT_MEAN: Final = "mismatch/is_weight_mean"

PERF_GEN_TOKENS_PER_S: Final = "perf/gen_tokens_per_s"
PERF_LEARNER_STEP_S: Final = "perf/learner_step_s"
PERF_LEARNER_WAIT_FRAC: Final = "perf/learner_wait_frac"
PERF_GEN_IDLE_FRAC: Final = "perf/gen_idle_frac"
PERF_WEIGHT_SYNC_S: Final = "perf/weight_sync_s"

VALUE_LOSS: Final = "value/loss"
VALUE_EXPLAINED_VAR: Final = "value/explained_var"
VALUE_CLIP_FRAC: Final = "value/clip_frac"
VALUE_MEAN: Final = "value/value_mean"
VALUE_RETURN_MEAN: Final = "value/return_mean"

MOE_LOAD_IMBALANCE: Final = "moe/load_imbalance"
MOE_ROUTER_ENTROPY: Final = "moe/router_entropy"
MOE_ROUTING_CHANGE_FRAC: Final = "moe/routing_change_frac"

# Every per-step metric, in a stable order: each row of metrics.parquet carries all of them
# (NaN where not measured), so every part file has the same schema and any Parquet reader,
# pandas included, sees every column.
ALL_METRICS: Final[tuple[str, ...]] = tuple(
    value for name, value in sorted(globals().items()) if name.isupper() and "/" in str(value)
)

# Prefix of metrics that depend on wall-clock timing; excluded from bitwise-reproducibility checks.
TIMING_PREFIX: Final = "perf/"
# Timing-dependent too: how many groups happened to be waiting when the step ended.
TIMING_DEPENDENT: Final[frozenset[str]] = frozenset({BUFFER_DEPTH})


def is_timing_dependent(name: str) -> bool:
    """True for metrics that differ between two runs of the same trial (wall clock, queueing)."""
    return name.startswith(TIMING_PREFIX) or name in TIMING_DEPENDENT


Reduction = Literal["mean", "min", "max", "sum", "last"]

# How partial measurements of one step combine into the step's value: over the step's minibatch
# updates and over data-parallel ranks (learner.step, learner.distributed), and over generators
# (buffer.telemetry). Shares are equal-sized (check_group_split), so a plain mean of means is the
# mean. Metrics measured once per step on the whole batch (reward/*, length/*, staleness/*,
# eval/*, buffer/*) declare the rule that would combine equal shares of them all the same.
REDUCTIONS: Final[Mapping[str, Reduction]] = MappingProxyType(
    {
        REWARD_MEAN: "mean",
        REWARD_STD: "mean",  # not the pooled std: the mean spread of equal shares
        REWARD_GROUP_STD_MEAN: "mean",
        GROUPS_ZERO_ADV_FRAC: "mean",
        EVAL_PASS_RATE: "mean",
        POLICY_KL_OLD: "mean",
        POLICY_KL_REF: "mean",
        POLICY_CLIP_FRAC: "mean",
        POLICY_CLIP_FRAC_SEQ: "mean",
        POLICY_CLIP_FRAC_LOW: "mean",
        POLICY_CLIP_FRAC_HIGH: "mean",
        POLICY_RATIO_MEAN: "mean",
        POLICY_RATIO_MIN: "min",  # the extreme ratio of the whole step, not a typical one
        POLICY_RATIO_MAX: "max",
        POLICY_RATIO_SEQ_MEAN: "mean",
        POLICY_RATIO_TOKEN_MEAN: "mean",
        POLICY_ENTROPY: "mean",
        POLICY_LOSS: "mean",
        OPTIM_GRAD_NORM: "mean",  # mean over the step's updates
        OPTIM_LR: "last",  # the schedule's value after the step's last update
        OPTIM_GRAD_SPIKES: "last",  # a running count since the start of the trial
        LENGTH_MEAN: "mean",
        LENGTH_P95: "max",  # an upper bound: the pooled p95 never exceeds the largest share's
        LENGTH_TRUNCATED_FRAC: "mean",
        STALENESS_MEAN: "mean",
        STALENESS_MAX: "max",
        BUFFER_DEPTH: "last",  # a gauge read when the step ends
        BUFFER_DROPPED_STALE: "last",  # run counters: the latest reading holds all earlier ones
        BUFFER_DEAD_LETTER: "last",
        MISMATCH_KL_BEHAVIOR: "mean",
        MISMATCH_IS_WEIGHT_MEAN: "mean",
        PERF_GEN_TOKENS_PER_S: "sum",  # fleet throughput: generators produce side by side
        PERF_LEARNER_STEP_S: "max",  # a data-parallel step lasts as long as its slowest rank
        PERF_LEARNER_WAIT_FRAC: "mean",
        PERF_GEN_IDLE_FRAC: "mean",
        PERF_WEIGHT_SYNC_S: "mean",
        VALUE_LOSS: "mean",
        VALUE_EXPLAINED_VAR: "mean",
        VALUE_CLIP_FRAC: "mean",
        VALUE_MEAN: "mean",
        VALUE_RETURN_MEAN: "mean",
        MOE_LOAD_IMBALANCE: "mean",
        MOE_ROUTER_ENTROPY: "mean",
        MOE_ROUTING_CHANGE_FRAC: "mean",
    }
)

_unruled = sorted(set(ALL_METRICS) ^ set(REDUCTIONS))
if _unruled:  # a new metric must say how it combines before anything can log it
    raise ImportError(f"contract.metrics: {_unruled} lack a REDUCTIONS entry (or are not metrics)")


def reduction(name: str) -> Reduction:
    """The rule that combines partial measurements of metric `name`."""
    try:
        return REDUCTIONS[name]
    except KeyError:
        raise KeyError(
            f"metric {name!r} is not in contract.metrics; register it there with a reduction"
        ) from None


def combine(name: str, values: Sequence[float]) -> float:
    """One value of metric `name` from its partial measurements, by its reduction.

    Plain left-to-right `sum(values) / len(values)` for the mean (not fsum), so a step's numbers
    are bitwise what they were before this table existed, and bitwise reproducible.
    """
    if not values:
        raise ValueError(f"no measurements of {name} to combine")
    how = reduction(name)
    if how == "mean":
        return sum(values) / len(values)
    if how == "sum":
        return sum(values)
    if how == "min":
        return min(values)
    if how == "max":
        return max(values)
    return values[-1]
