"""Tuning: an experiment with a tuning stage gets a section with the selected configurations,
hand-checked expected-validation-performance curves, the budget at which the leader changes and
the sensitivity table; an experiment without one gets nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import ReportConfig, build_report
from analysis.report import ReportResult
from analysis.sections.tuning.rows import ranking_rows
from analysis.sections.tuning.text import margin_caveat
from analysis.stats import expected_max_curve
from analysis.synthetic import SyntheticSpec, write_experiment

FAST = ReportConfig(n_resamples=400, curve_resamples=200, figure_dpi=50)
TABLES_ONLY = ReportConfig(n_resamples=400, curve_resamples=200, make_figures=False)
SPEC = SyntheticSpec(
    skill={"gspo": 0.7, "grpo": 0.6}, seeds=(0, 1), lags=(0,), steps=20, eval_every=10
)
TUNING_SEEDS = (100, 101)
# Each configuration's mean validation score over the tuning seeds: grpo is steady, gspo has one
# excellent configuration among poor ones, so grpo leads when one configuration is drawn and
# gspo once two or more are. grpo's configuration 3 failed on seed 101: its score is seed 100's.
MEANS = {"grpo": [0.60, 0.58, 0.56, 0.54], "gspo": [0.40, 0.40, 0.80, 0.40]}
LR = [1e-6, 1e-5, 1e-6, 1e-5]  # both arms, by configuration index
EPS_HIGH = [0.2, 0.28, 0.2, 0.28]  # gspo only
FAILED = ("grpo", 3, 101)


def _settings(arm: str, config: int) -> dict:
    settings = {"lr": LR[config]}
    return settings | ({"eps_high": EPS_HIGH[config]} if arm == "gspo" else {})


def tuning_trials() -> pd.DataFrame:
    """One row per (arm, config, seed): seed 100 scores mean + 0.01, seed 101 mean - 0.01."""
    rows = []
    for arm, means in MEANS.items():
        for config, mean in enumerate(means):
            for seed, shift in zip(TUNING_SEEDS, (0.01, -0.01), strict=True):
                failed = (arm, config, seed) == FAILED
                score = math.nan if failed else mean + shift
                if (arm, config) == FAILED[:2]:
                    score = math.nan if failed else mean  # the one seed left scores the mean
                rows.append(
                    {
                        "arm": arm,
                        "config": config,
                        "seed": seed,
                        "score": score,
                        "status": "failed" if failed else "completed",
                        "param.lr": LR[config],
                        "param.eps_high": EPS_HIGH[config] if arm == "gspo" else math.nan,
                    }
                )
    return pd.DataFrame(rows)


def selection(trials: pd.DataFrame) -> dict:
    arms = {}
    for arm, group in trials.groupby("arm", sort=True):
        configs = []
        for config, cell in group.groupby("config", sort=True):
            scored = cell["score"].dropna()
            configs.append(
                {
                    "index": int(config),
                    "settings": _settings(str(arm), int(config)),
                    "score": float(scored.mean()),
                    "n_seeds": len(scored),
                }
            )
        best = max(configs, key=lambda c: c["score"])
        arms[str(arm)] = {
            "selected": best["index"],
            "score": best["score"],
            "settings": best["settings"],
            "configs": configs,
        }
    return {
        "metric": "final",
        "validation": {"name": "val", "task": "gsm8k", "offset": 1000, "size": 200},
        "budget": 4,
        "seeds": list(TUNING_SEEDS),
        "evaluation_seeds": list(SPEC.seeds),
        "arms": arms,
    }


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> ReportResult:
    tmp = tmp_path_factory.mktemp("tuned")
    root = write_experiment(tmp / "exp", SPEC)
    (root / "tuning").mkdir()
    trials = tuning_trials()
    trials.to_parquet(root / "tuning" / "tuning_scores.parquet", index=False)
    (root / "tuning" / "selection.json").write_text(json.dumps(selection(trials)))
    return build_report(root, tmp / "report", FAST)


def _rows(summary: pd.DataFrame, section: str, statistic: str) -> pd.DataFrame:
    return summary[(summary["section"] == section) & (summary["statistic"] == statistic)]


def _one(summary: pd.DataFrame, section: str, statistic: str, **keys: object) -> pd.Series:
    rows = _rows(summary, section, statistic)
    for key, value in keys.items():
        rows = rows[rows[key] == value]
    assert len(rows) == 1, (section, statistic, keys)
    return rows.iloc[0]


def test_selected_configuration_per_arm(report: ReportResult) -> None:
    s = report.summary
    grpo = _one(s, "tuning_selected", "selected_config", arm="grpo")
    gspo = _one(s, "tuning_selected", "selected_config", arm="gspo")
    assert (grpo["value"], grpo["note"]) == (0, "lr=1e-06")
    assert (gspo["value"], gspo["note"]) == (2, "lr=1e-06, eps_high=0.2")
    score = _one(s, "tuning_selected", "tuning_score", arm="gspo")
    assert score["value"] == pytest.approx(0.80, abs=1e-12) and score["n"] == 2
    assert _one(s, "tuning_selected", "tuning_score", arm="grpo")["value"] == pytest.approx(0.60)
    for arm in MEANS:
        assert _one(s, "tuning_selected", "budget", arm=arm)["value"] == 4
    assert _one(s, "tuning_protocol", "budget")["value"] == 4
    assert _one(s, "tuning_protocol", "tuning_seeds")["note"] == "100, 101"
    assert _one(s, "tuning_protocol", "selection_metric")["note"] == "final"


# Unbiased expected max of the order statistics v_(1..4): weights C(i-1, n-1) / C(4, n).
# grpo 0.54 0.56 0.58 0.60: n=2 (0.56 + 2 x 0.58 + 3 x 0.60) / 6, n=3 (0.58 + 3 x 0.60) / 4.
# gspo 0.40 0.40 0.40 0.80: the max is 0.80 with probability n / 4, else 0.40.
EXPECTED_MAX = {
    "grpo": [0.57, 3.52 / 6, 0.595, 0.60],
    "gspo": [0.50, 0.60, 0.70, 0.80],
}
# Std of the max: at n=1 the population std of the scores; gspo at n=2 a fair coin on 0.4/0.8.
EXPECTED_STD = {("grpo", 1): math.sqrt(0.0005), ("gspo", 1): math.sqrt(0.03), ("gspo", 2): 0.2}


def test_expected_max_curves_hand_computed(report: ReportResult) -> None:
    s = report.summary
    for arm, values in EXPECTED_MAX.items():
        for budget, value in enumerate(values, start=1):
            r = _one(s, "tuning_evp", "expected_max", arm=arm, comparison=f"budget {budget}")
            assert r["value"] == pytest.approx(value, abs=1e-12)
            assert r["n"] == 4
        top = _one(s, "tuning_evp", "expected_max_std", arm=arm, comparison="budget 4")
        assert top["value"] == pytest.approx(0.0, abs=1e-12)
    for (arm, budget), std in EXPECTED_STD.items():
        r = _one(s, "tuning_evp", "expected_max_std", arm=arm, comparison=f"budget {budget}")
        assert r["value"] == pytest.approx(std, abs=1e-12)


def test_the_winner_change_names_the_budget_and_the_arms(report: ReportResult) -> None:
    s = report.summary
    leaders = _rows(s, "tuning_ranking", "leader")
    assert list(leaders["arm"]) == ["grpo", "gspo", "gspo", "gspo"]
    assert list(leaders["comparison"]) == [f"budget {b}" for b in range(1, 5)]
    change = _one(s, "tuning_ranking", "winner_changes")
    assert change["value"] == 1.0
    assert change["note"] == (
        "The winner changes with the budget: grpo leads at budget 1, then gspo from 2 "
        "configurations tried."
    )


def test_sensitivity_per_arm_hyperparameter_and_value(report: ReportResult) -> None:
    s = report.summary
    # grpo lr=1e-5: configurations 1 and 3; seed 100 (0.59 + 0.54) / 2, seed 101 0.57 alone.
    cells = {
        ("grpo", "lr = 1e-06"): (0.59 + 0.57) / 2,
        ("grpo", "lr = 1e-05"): ((0.59 + 0.54) / 2 + 0.57) / 2,
        ("gspo", "lr = 1e-06"): 0.60,
        ("gspo", "eps_high = 0.28"): 0.40,
    }
    for (arm, cell), mean in cells.items():
        r = _one(s, "tuning_sensitivity", "mean_score", arm=arm, comparison=cell)
        assert r["value"] == pytest.approx(mean, abs=1e-12)
        assert r["ci_low"] <= r["value"] <= r["ci_high"] and r["n"] == 2
    grpo = _rows(s, "tuning_sensitivity", "mean_score").query("arm == 'grpo'")
    assert not grpo["comparison"].str.startswith("eps_high").any()  # not in grpo's space


def test_markdown_and_figures(report: ReportResult) -> None:
    md = report.markdown_path.read_text()
    assert "## Tuning" in md and md.index("## Trials") < md.index("## Tuning")
    assert "B = 4 configurations" in md and "(100, 101)" in md and "gsm8k" in md
    assert "at budget 1 grpo leads with 0.570; at budget 4 gspo leads with 0.800." in md
    assert "Dodge et al. 2019" in md and "Dodge et al. 2021" in md
    for name in ("tuning_evp", "tuning_sensitivity"):
        assert report.figure_paths[name].is_file()
        assert f"figures/{name}.png" in md


def test_no_tuning_files_no_tuning_rows(tmp_path: Path) -> None:
    root = write_experiment(tmp_path / "exp", SPEC)
    result = build_report(root, tmp_path / "report", TABLES_ONLY)
    assert not result.summary["section"].str.startswith("tuning").any()
    md = result.markdown_path.read_text()
    assert "Tuning" not in md and "Dodge" not in md


def test_a_leader_that_never_changes_is_said_so() -> None:
    curves = {
        "a": expected_max_curve(np.array([0.7, 0.8, 0.9])),
        "b": expected_max_curve(np.array([0.1, 0.2, 0.3])),
    }
    change = ranking_rows(curves)[-1]
    assert change["value"] == 0.0
    assert change["note"] == (
        "The winner does not change with the budget: a leads at every budget from 1 to 3."
    )


def test_each_lead_is_read_against_the_seed_noise_of_the_selected_configurations(
    report: ReportResult,
) -> None:
    s = report.summary
    # grpo's selected configuration 0 scored 0.61 and 0.59, gspo's 2 0.81 and 0.79: SE 0.01
    assert _one(s, "tuning_ranking", "seed_se")["value"] == pytest.approx(0.01, abs=1e-12)
    margin = _one(s, "tuning_ranking", "margin", comparison="budget 1")["value"]
    assert margin == pytest.approx(EXPECTED_MAX["grpo"][0] - EXPECTED_MAX["gspo"][0], abs=1e-12)
    margin = _one(s, "tuning_ranking", "margin", comparison="budget 4")["value"]
    assert margin == pytest.approx(0.80 - 0.60, abs=1e-12)
    md = report.markdown_path.read_text()
    assert "At every budget the lead exceeds the selected configurations' standard error" in md


def test_a_lead_inside_the_seed_noise_is_not_called_a_ranking() -> None:
    summary = pd.DataFrame(
        [
            {
                "section": "tuning_ranking",
                "statistic": "margin",
                "comparison": f"budget {b}",
                "budget": b,
                "value": v,
            }
            for b, v in ((1, 0.05), (2, 0.004), (3, 0.001))
        ]
        + [{"section": "tuning_ranking", "statistic": "seed_se", "comparison": "x", "value": 0.01}]
    )
    assert margin_caveat(summary) == (
        " The lead at budget 2, 3 is smaller than the selected configurations' standard error "
        "over tuning seeds (0.010): the order of the arms there is not established."
    )
