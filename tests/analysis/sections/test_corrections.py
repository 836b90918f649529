"""Off-policy corrections x lag: run-level bias, per-trial reductions, the report section."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest

from analysis import ReportConfig, build_report
from analysis.sections.corrections import (
    correction_rows,
    groups_per_step,
    run_bias,
    trial_reductions,
)
from analysis.stats import BootstrapSpec
from analysis.synthetic import SyntheticSpec, write_experiment
from contract import metrics as mn

SPEC = BootstrapSpec(n_resamples=400, confidence=0.95, seed=0)
FAST = ReportConfig(n_resamples=400, curve_resamples=200, figure_dpi=50)
TABLES_ONLY = FAST.model_copy(update={"make_figures": False})
NAN = math.nan


def _bounded_trial() -> pd.DataFrame:
    """P = 4 trained groups per step; step 0 is an eval-only row (no trained mean).

    step  T (reward)  d  D (reward)  T (length)  D (length)
      1     0.5       0     -           100          -
      2     0.6       2    0.2          110         150
      3     0.7       1    0.1          120         160
    Per-step bias = d (T - D) / (P + d): reward 0, 2 * 0.4 / 6 = 0.133333, 1 * 0.6 / 5 = 0.12;
    length 0, 2 * (-40) / 6 = -13.333333, 1 * (-40) / 5 = -8.
    """
    return pd.DataFrame(
        {
            mn.STEP: [0, 1, 2, 3],
            mn.REWARD_MEAN: [NAN, 0.5, 0.6, 0.7],
            mn.LENGTH_MEAN: [NAN, 100.0, 110.0, 120.0],
            mn.STALENESS_DROPPED: [NAN, 0.0, 2.0, 1.0],
            mn.STALENESS_DROPPED_REWARD_MEAN: [NAN, NAN, 0.2, 0.1],
            mn.STALENESS_DROPPED_LENGTH_MEAN: [NAN, NAN, 150.0, 160.0],
            mn.STALENESS_BIAS_REWARD: [NAN, 0.0, 0.8 / 6, 0.6 / 5],
            mn.STALENESS_BIAS_LENGTH: [NAN, 0.0, -80 / 6, -40 / 5],
        }
    )


def test_run_bias_hand_computed() -> None:
    trial = _bounded_trial()
    trained, dropped = trial[mn.REWARD_MEAN].to_numpy(), trial[mn.STALENESS_DROPPED].to_numpy()
    dropped_mean = trial[mn.STALENESS_DROPPED_REWARD_MEAN].to_numpy()
    # N = 3 steps * 4 = 12 trained groups of mean 0.6 (sum 7.2); dropped: 2 * 0.2 + 0.1 = 0.5
    # over 3 groups. Read mean = (7.2 + 0.5) / 15 = 0.513333; bias = 0.6 - 0.513333 = 0.086667
    # (= (2 * 0.4 + 1 * 0.5) / 15 = 1.3 / 15).
    assert run_bias(trained, dropped, dropped_mean, 4.0) == pytest.approx(1.3 / 15, rel=1e-12)
    # The unweighted mean of per-step biases, (0 + 0.133333 + 0.12) / 3 = 0.084444, is not it.
    assert run_bias(trained, dropped, dropped_mean, 4.0) != pytest.approx((0.8 / 6 + 0.6 / 5) / 3)
    no_drops = np.array([NAN, 0.0, 0.0, 0.0])
    assert run_bias(trained, no_drops, np.full(4, NAN), NAN) == 0.0  # exact, whatever P
    assert math.isnan(run_bias(trained, dropped, dropped_mean, NAN))  # weighting unknown
    assert math.isnan(run_bias(trained, np.full(4, NAN), dropped_mean, 4.0))  # never counted


def test_groups_per_step_from_the_bias_identity() -> None:
    # P = d (T - D) / bias - d: step 2: 2 * 0.4 / 0.133333 - 2 = 4; step 3: 0.6 / 0.12 - 1 = 4.
    assert groups_per_step(_bounded_trial()) == 4.0
    no_drops = _bounded_trial().assign(**{mn.STALENESS_DROPPED: 0.0})
    assert math.isnan(groups_per_step(no_drops))  # nothing identifies P ...
    assert math.isnan(groups_per_step(pd.DataFrame({mn.STEP: [0, 1]})))  # ... or nothing logged
    # The learner's own count wins when logged (one step refused a poison group: median 4).
    counted = no_drops.assign(**{mn.GROUPS_TRAINED: [np.nan, 4.0, 3.0, 4.0]})
    assert groups_per_step(counted) == 4.0


def test_trial_reductions_hand_computed() -> None:
    got = trial_reductions(_bounded_trial())
    assert got["dropped_total"] == 3.0
    assert got["dropped_frac"] == pytest.approx(3 / 15, rel=1e-12)  # 3 of 12 + 3 groups read
    assert got["bias_reward"] == pytest.approx(1.3 / 15, rel=1e-12)
    # Length: trained mean 110; sum d (110 - D) = 2 * -40 + 1 * -50 = -130; / 15 = -8.666667.
    assert got["bias_length"] == pytest.approx(-130 / 15, rel=1e-12)
    assert math.isnan(got["ess_frac"]) and math.isnan(got["routing_change_frac"])


def _trial_frame(name: str, ess: list[float], clip: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "trial_name": name,
            mn.STEP: range(len(ess)),
            mn.OFFPOLICY_ESS_FRAC: ess,
            mn.POLICY_CLIP_FRAC: clip,
        }
    )


def _scores(names: list[str], lags: list[int]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "trial_name": names,
            "arm": "a",
            "seed": range(len(names)),
            "lag": lags,
            "status": "completed",
            "diverged": False,
            "scored": True,
            "final_score": [0.5, 0.6, 0.7],
            "auc": [0.4, 0.5, 0.6],
        }
    )


def test_ess_and_clip_aggregation_hand_computed() -> None:
    metrics = pd.concat(
        [
            # lag 2, seed 0: ESS mean over measured steps (1 + 0.8 + 0.6) / 3 = 0.8; clip 0.1
            _trial_frame("t0", [1.0, 0.8, NAN, 0.6], [0.1, 0.1, 0.1, 0.1]),
            # lag 2, seed 1: ESS (0.5 + 0.7) / 2 = 0.6; clip (0.2 + 0.4) / 2 = 0.3
            _trial_frame("t1", [0.5, 0.7], [0.2, 0.4]),
            _trial_frame("t2", [0.9, 0.9], [0.05, 0.05]),  # lag 0, one seed
        ]
    )
    rows = correction_rows(metrics, _scores(["t0", "t1", "t2"], [2, 2, 0]), SPEC)
    got = {(r["statistic"], r["lag"]): r for r in rows}
    assert got[("ess_frac", 2)]["value"] == pytest.approx(0.7, rel=1e-12)  # (0.8 + 0.6) / 2
    assert got[("ess_frac", 2)]["n"] == 2
    assert 0.6 <= got[("ess_frac", 2)]["ci_low"] <= got[("ess_frac", 2)]["ci_high"] <= 0.8
    assert got[("clip_frac", 2)]["value"] == pytest.approx(0.2, rel=1e-12)  # (0.1 + 0.3) / 2
    one = got[("ess_frac", 0)]
    assert one["value"] == pytest.approx(0.9) and math.isnan(one["ci_low"]) and one["n"] == 1
    # Final score IQM of one or two seeds is their mean: lag 2 -> (0.5 + 0.6) / 2.
    assert got[("final_score_iqm", 2)]["value"] == pytest.approx(0.55, rel=1e-12)
    assert got[("auc_iqm", 0)]["value"] == pytest.approx(0.6, rel=1e-12)
    # Never measured: no rows, so no empty columns or tables.
    stats = {r["statistic"] for r in rows}
    assert not stats & {"masked_frac", "bias_reward", "dropped_total", "routing_change_frac"}


def _section(summary: pd.DataFrame) -> pd.DataFrame:
    return summary[summary["section"] == "corrections"]


def test_section_for_a_multi_lag_experiment_with_the_metrics(tmp_path: Path) -> None:
    spec = SyntheticSpec(
        skill={"grpo_naive": 0.6, "grpo_tis_seq": 0.65},
        seeds=(0, 1, 2),
        lags=(0, 2, 8),
        steps=20,
        mode="bounded",
        corrections=True,
    )
    root = write_experiment(tmp_path / "exp", spec)
    result = build_report(root, tmp_path / "out", FAST)
    section = _section(result.summary)
    assert set(section["statistic"]) >= {"final_score_iqm", "ess_frac", "bias_length"}
    assert set(section["statistic"]) >= {"dropped_frac", "rollout_routing_mismatch"}
    assert "corrections" in result.figure_paths
    md = result.markdown_path.read_text()
    assert (
        "## Off-policy corrections and staleness" in md and "| arm | lag 0 | lag 2 | lag 8 |" in md
    )
    assert "short and often easy" in md
    # The run-level reward bias, recomputed from the parquet with the synthetic P = 8.
    biases = []
    for seed in spec.seeds:
        trial = root / "trials" / f"grpo_tis_seq-s{seed}-lag8" / "metrics.parquet"
        t = ds.dataset(trial, format="parquet").to_table().to_pandas()
        d, dm = t[mn.STALENESS_DROPPED], t[mn.STALENESS_DROPPED_REWARD_MEAN].fillna(0)
        trained_sum = 8 * t[mn.REWARD_MEAN].sum()
        read_mean = (trained_sum + (d * dm).sum()) / (8 * len(t) + d.sum())
        biases.append(t[mn.REWARD_MEAN].mean() - read_mean)
    row = section[(section["statistic"] == "bias_reward") & (section["arm"] == "grpo_tis_seq")]
    row = row[row["lag"] == 8].iloc[0]
    assert row["value"] == pytest.approx(np.mean(biases), rel=1e-9) and row["value"] > 0
    lag0 = section[(section["statistic"] == "dropped_total") & (section["lag"] == 0)]
    assert (lag0["value"] == 0).all()  # lag 0 never drops


def test_section_absent_without_lags_or_metrics(tmp_path: Path) -> None:
    root = write_experiment(tmp_path / "one", SyntheticSpec(seeds=(0, 1), lags=(0,), steps=20))
    result = build_report(root, tmp_path / "out1", FAST)
    assert _section(result.summary).empty and "corrections" not in result.figure_paths
    assert "Off-policy corrections" not in result.markdown_path.read_text()


def test_multi_lag_without_metrics_shows_scores_only(tmp_path: Path) -> None:
    spec = SyntheticSpec(skill={"a": 0.6, "b": 0.5}, seeds=(0, 1), lags=(0, 4), steps=20)
    result = build_report(write_experiment(tmp_path / "exp", spec), tmp_path / "out", FAST)
    assert set(_section(result.summary)["statistic"]) == {"final_score_iqm", "auc_iqm"}
    md = result.markdown_path.read_text()
    assert "## Off-policy corrections and staleness" in md
    assert "### Correction diagnostics" not in md and "### Staleness accounting" not in md
    assert "corrections" not in result.figure_paths  # scores vs lag: the trade-off figure has it


def test_single_lag_with_a_correction_arm_shows_the_section(tmp_path: Path) -> None:
    spec = SyntheticSpec(
        skill={"a": 0.6, "b": 0.5},
        seeds=(0, 1),
        lags=(1,),
        steps=20,
        corrections=True,
        arm_corrections={"b": "tis_seq"},  # in each trial's resolved_config.yaml
    )
    result = build_report(write_experiment(tmp_path / "exp", spec), tmp_path / "out", FAST)
    md = result.markdown_path.read_text()
    assert "## Off-policy corrections and staleness" in md
    assert "### Correction diagnostics" in md and "### MoE routing" in md
    # Fixed mode drops nothing: the bias is exactly 0 and the fraction dropped is 0.
    section = _section(result.summary)
    assert (section[section["statistic"].isin(["bias_reward", "dropped_frac"])]["value"] == 0).all()
    assert "corrections" not in result.figure_paths  # one lag: every panel one point per arm


def test_single_lag_without_a_correction_arm_has_no_section(tmp_path: Path) -> None:
    """The quickstart's shape: every run logs ESS and staleness times, but no arm corrects and
    only lag 0 ran, so the section would restate the setup (ESS 1, nothing dropped)."""
    spec = SyntheticSpec(
        skill={"a": 0.6, "b": 0.5}, seeds=(0, 1), lags=(0,), steps=20, corrections=True
    )
    root = write_experiment(tmp_path / "exp", spec)
    _without_moe_routing(root)  # a dense model's runs log the MoE metrics as NaN
    result = build_report(root, tmp_path / "out", TABLES_ONLY)
    assert _section(result.summary).empty
    assert "Off-policy corrections" not in result.markdown_path.read_text()


def _without_moe_routing(root: Path) -> None:
    """Blank the synthetic trials' MoE routing columns: what a dense policy's trial logs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for part in sorted(root.glob("trials/*/metrics.parquet/part-*.parquet")):
        table = pq.read_table(part)
        for name in (mn.MOE_ROUTING_CHANGE_FRAC, mn.MOE_ROLLOUT_ROUTING_MISMATCH):
            index = table.schema.get_field_index(name)
            if index >= 0:
                nan = pa.array([float("nan")] * table.num_rows, pa.float64())
                table = table.set_column(index, name, nan)
        pq.write_table(table, part)
