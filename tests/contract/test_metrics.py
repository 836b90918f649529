"""The metric schema: every metric has a reduction rule, and `combine` applies it exactly."""

from __future__ import annotations

import math
import typing

import pytest

from contract import metrics as M


def test_every_metric_has_exactly_one_valid_rule() -> None:
    assert set(M.REDUCTIONS) == set(M.ALL_METRICS)
    assert set(M.REDUCTIONS.values()) <= set(typing.get_args(M.Reduction))
    assert len(set(M.ALL_METRICS)) == len(M.ALL_METRICS)  # no name registered twice


def test_all_metrics_holds_design_section_7_names_only() -> None:
    assert {"reward/mean", "policy/clip_frac_seq", "mismatch/kl_behavior"} <= set(M.ALL_METRICS)
    assert {"perf/gen_tokens_per_s", "value/explained_var", "moe/routing_change_frac"} <= set(
        M.ALL_METRICS
    )
    # identity columns and the timing prefix are not metrics
    assert not {M.STEP, M.TIMESTAMP, M.TIMING_PREFIX} & set(M.ALL_METRICS)


def test_learner_rule_is_the_one_it_used_before_the_table() -> None:
    # learner.runtime.step / learner.runtime.distributed chose by suffix: min for *ratio_min, max
    # for *ratio_max, mean for everything else; the table must give the same for what they combine.
    for name in M.ALL_METRICS:
        if name.startswith(("policy/", "value/")):
            old = (
                "min"
                if name.endswith("ratio_min")
                else "max"
                if name.endswith("ratio_max")
                else "mean"
            )
            assert M.reduction(name) == old, name
    assert M.reduction(M.OPTIM_GRAD_NORM) == "mean"  # mean over the step's updates


def test_generator_fleet_rule_is_the_one_telemetry_used() -> None:
    assert M.reduction(M.PERF_GEN_TOKENS_PER_S) == "sum"
    assert M.reduction(M.PERF_GEN_IDLE_FRAC) == M.reduction(M.PERF_WEIGHT_SYNC_S) == "mean"


def test_combine_hand_worked_values() -> None:
    # mean: (0.5 + 0.25 + 0.75) / 3 = 0.5, exact in binary
    assert M.combine(M.POLICY_CLIP_FRAC, [0.5, 0.25, 0.75]) == 0.5
    # same left-to-right arithmetic as the code it replaced: 0.1 + 0.2 + 0.4 = 0.7000000000000001
    assert M.combine(M.POLICY_KL_OLD, [0.1, 0.2, 0.4]) == (0.1 + 0.2 + 0.4) / 3
    assert M.combine(M.POLICY_RATIO_MIN, [0.98, 0.95, 1.01]) == 0.95
    assert M.combine(M.POLICY_RATIO_MAX, [0.98, 1.04, 1.01]) == 1.04
    assert M.combine(M.PERF_GEN_TOKENS_PER_S, [120.0, 80.0]) == 200.0  # two generators
    assert M.combine(M.OPTIM_LR, [3e-4, 2e-4, 1e-4]) == 1e-4  # the schedule after the last update
    assert M.combine(M.STALENESS_MAX, [0.0, 2.0, 1.0]) == 2.0
    assert math.isnan(M.combine(M.VALUE_LOSS, [1.0, math.nan]))  # a NaN share is not hidden


def test_combine_refuses_unknown_names_and_nothing_to_combine() -> None:
    with pytest.raises(KeyError, match=r"'policy/typo' is not in contract\.metrics"):
        M.combine("policy/typo", [1.0])
    with pytest.raises(ValueError, match="no measurements of reward/mean"):
        M.combine(M.REWARD_MEAN, [])


def test_timing_dependent_metrics() -> None:
    assert M.is_timing_dependent(M.PERF_LEARNER_STEP_S) and M.is_timing_dependent(M.BUFFER_DEPTH)
    assert not M.is_timing_dependent(M.REWARD_MEAN)


def test_per_layer_family_names_reductions_and_refusals() -> None:
    # Sparse layer 3 of an MoE policy: zero-padded to 2 digits, 3 past 99 (Qwen3-235B: 94).
    assert M.moe_routing_change_layer(3) == "moe/routing_change_frac/layer_03"
    assert M.moe_routing_change_layer(120) == "moe/routing_change_frac/layer_120"
    name = M.moe_routing_change_layer(3)
    assert M.is_metric(name) and name not in M.ALL_METRICS  # a family member, not a column
    assert M.family_of(name) == M.MOE_ROUTING_CHANGE_LAYER_PREFIX
    assert M.reduction(name) == "mean" and M.combine(name, [0.25, 0.75]) == 0.5
    assert M.MOE_ROUTING_CHANGE_LAYER_PREFIX not in M.ALL_METRICS  # the prefix is no metric
    for typo in ("moe/routing_change_frac/layer_3", "moe/routing_change_frac/layer_x1"):
        assert not M.is_metric(typo)
        with pytest.raises(KeyError, match=r"is not in contract\.metrics"):
            M.reduction(typo)
    with pytest.raises(ValueError, match="negative"):
        M.moe_routing_change_layer(-1)
