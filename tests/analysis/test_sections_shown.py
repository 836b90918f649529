"""A section or figure appears only when its axis varies (issue 37), and the Methods list cites
only the sections shown.

One lag: no staleness trade-off figure or Pareto flags (each lag would be compared with itself)
and, without a correction arm, no "Off-policy corrections and staleness" section but its MoE
routing table when the trials measured routing, even though every run logs ESS and staleness
times. Several lags: all of them. One arm: no Comparisons
section and none of its methods.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from analysis import ReportConfig, build_report
from analysis.loading import load_experiment
from analysis.report import analyse, make_figures
from analysis.sections import comparisons, eval_aggregates
from analysis.synthetic import write_experiment
from tests.analysis.experiments import TWO_ARMS

TABLES_ONLY = ReportConfig(n_resamples=100, curve_resamples=100, make_figures=False)
SEVERAL_LAGS = replace(TWO_ARMS, steps=20, corrections=True, eval_sets=("heldout", "hard"))
ONE_LAG = replace(SEVERAL_LAGS, lags=(0,), diverged=())
ONE_ARM = replace(ONE_LAG, skill={"gspo": 0.7}, eval_sets=())


def shown(spec, tmp: Path) -> tuple[pd.DataFrame, set[str], str]:
    """(summary, names of the figures drawn, report.md) of `spec`'s report."""
    root = write_experiment(tmp / "exp", spec)
    result = build_report(root, tmp / "out", TABLES_ONLY)
    drawn = make_figures(analyse(load_experiment(root), TABLES_ONLY), TABLES_ONLY)
    return result.summary, set(drawn), result.markdown_path.read_text()


@pytest.fixture(scope="module")
def one_lag(tmp_path_factory: pytest.TempPathFactory):
    return shown(ONE_LAG, tmp_path_factory.mktemp("one_lag"))


@pytest.fixture(scope="module")
def several_lags(tmp_path_factory: pytest.TempPathFactory):
    return shown(SEVERAL_LAGS, tmp_path_factory.mktemp("several_lags"))


def _statistics(summary: pd.DataFrame, section: str) -> set[str]:
    return set(summary.loc[summary["section"] == section, "statistic"])


def _methods(markdown: str) -> str:
    return markdown.split("## Methods", 1)[1]


def test_one_lag_has_no_tradeoff_pareto_or_corrections(one_lag) -> None:
    summary, figures, md = one_lag
    assert "staleness_tradeoff" not in figures and "corrections" not in figures
    stats = _statistics(summary, "staleness")
    assert stats == {"steps_per_s", "learner_wait_frac", "gen_idle_frac"}  # no pareto_*
    # The synthetic trials log MoE routing (as MoE trials would): only that table is shown.
    assert _statistics(summary, "corrections") == {
        "routing_change_frac",
        "rollout_routing_mismatch",
    }
    assert "## Throughput and utilisation" in md and "Staleness and utilisation" not in md
    assert "Correction diagnostics" not in md and "by correction and lag" not in md


def test_several_lags_have_tradeoff_pareto_and_corrections(several_lags) -> None:
    summary, figures, md = several_lags
    assert {"staleness_tradeoff", "corrections"} <= figures
    assert {"pareto_within_arm", "pareto_overall"} <= _statistics(summary, "staleness")
    assert {"final_score_iqm", "ess_frac"} <= _statistics(summary, "corrections")
    assert "## Staleness and utilisation" in md and "## Off-policy corrections and staleness" in md


def test_methods_cite_only_the_sections_shown(several_lags, tmp_path: Path) -> None:
    _, _, md = several_lags
    cited = [*comparisons.METHODS, *eval_aggregates.METHODS]
    assert "## Comparisons" in md and all(item in _methods(md) for item in cited)
    _, figures, md = shown(ONE_ARM, tmp_path)  # one arm, one eval set: nothing to compare
    assert "## Comparisons" not in md and "probability_of_improvement" not in figures
    assert not any(item in _methods(md) for item in cited)
    assert "Paired tests" not in md and "Across eval sets" not in md
    assert "Which arm leads at equal budget" not in md  # one arm: no leader to name
    assert "Fisher's exact test" not in md.split("## Methods", 1)[0]  # no pair of arms


def test_a_rebuilt_report_keeps_only_its_own_figures(tmp_path: Path) -> None:
    """A report directory rebuilt after its experiment changed shape holds exactly the figures
    of the new build: the trade-off plot of an earlier multi-lag build does not linger beside a
    one-lag report (`analysis.report.draw_figures`)."""
    out = tmp_path / "out"
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True)
    (fig_dir / "staleness_tradeoff.png").write_bytes(b"an earlier build's figure")
    (fig_dir / "notes.txt").write_text("not a figure: kept")
    root = write_experiment(tmp_path / "exp", ONE_LAG)
    config = ReportConfig(n_resamples=100, curve_resamples=100, figure_dpi=50)
    build_report(root, out, config)
    drawn = {path.stem for path in fig_dir.glob("*.png")}
    assert "staleness_tradeoff" not in drawn and "learning_curves" in drawn
    assert (fig_dir / "notes.txt").exists()


def test_one_lag_of_moe_trials_shows_the_routing_table_alone(tmp_path: Path) -> None:
    """How much routing moves is a finding at any lag: an MoE experiment at one lag and without
    a correction arm gets the MoE routing table of the corrections section, and nothing else
    of that section (no score grid, diagnostics or figure)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from contract import metrics as mn
    from contract.layout import TrialPaths

    root = write_experiment(tmp_path / "exp", replace(ONE_LAG, corrections=False))
    for part in sorted(root.glob("trials/*/metrics.parquet/part-*.parquet")):
        table = pq.read_table(part)
        steps = table.column(mn.STEP).to_pylist()
        for name, value in ((mn.MOE_ROUTING_CHANGE_FRAC, 0.2), (mn.MOE_TOKEN_REROUTED_FRAC, 0.7)):
            values = [value if step > 0 else float("nan") for step in steps]
            table = table.append_column(name, pa.array(values, pa.float64()))
        pq.write_table(table, part)
    assert TrialPaths(next(root.glob("trials/*"))).metrics.is_dir()
    result = build_report(root, tmp_path / "out", TABLES_ONLY)
    summary, md = result.summary, result.markdown_path.read_text()
    assert _statistics(summary, "corrections") == {"routing_change_frac", "token_rerouted_frac"}
    assert "### MoE routing" in md and "by correction and lag" not in md
    assert "Correction diagnostics" not in md
