"""The one place metric names live (design section 7).

Every producer (learner, generator, buffer) and every consumer (analysis, MLflow logging) imports
names from here, so a typo is an ImportError instead of a silently empty column. The names are the
Parquet column names and the MLflow metric keys.
"""

from __future__ import annotations

from typing import Final

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
POLICY_RATIO_MEAN: Final = "policy/ratio_mean"
POLICY_RATIO_MIN: Final = "policy/ratio_min"
POLICY_RATIO_MAX: Final = "policy/ratio_max"
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
