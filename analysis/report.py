"""Build the comparison report of one experiment: load, analyse, plot, render, write.

Public entry point: `build_report(root, out_dir, config) -> ReportResult`. Outputs in `out_dir`:
`report.md`, `report.html` (self-contained), `summary.parquet` (every number shown, long
format) and `figures/*.png`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis import eval_figures, figures
from analysis.comparisons import poi_rows, power_rows, significance_rows
from analysis.compute_matched import (
    aggregate_matched,
    budget_curves,
    completed,
    compute_matched_rows,
    matched_curves,
)
from analysis.config import ReportConfig
from analysis.correction_figures import corrections_figure
from analysis.corrections import correction_rows
from analysis.curves import aggregate_curves, bin_steps, curve_rows, trial_curves
from analysis.document import report_blocks
from analysis.eval_sets import eval_set_rows, eval_set_scores
from analysis.loading import Experiment, load_experiment
from analysis.next_steps import launch_facts, next_step_rows
from analysis.performance import performance_rows
from analysis.render import to_html, to_markdown
from analysis.stability import stability_rows
from analysis.staleness import frontier_table, staleness_rows
from analysis.stats import BootstrapSpec
from analysis.summary import row, to_frame
from analysis.trial_scores import finished, score_trials
from contract import metrics as mn

DIAGNOSTICS = {"clip fraction": mn.POLICY_CLIP_FRAC, "KL to old policy": mn.POLICY_KL_OLD}


@dataclass(frozen=True)
class ReportResult:
    """Where the report went, and the summary frame it shows."""

    out_dir: Path
    markdown_path: Path
    html_path: Path
    summary_path: Path
    figure_paths: dict[str, Path]
    summary: pd.DataFrame
    problems: pd.DataFrame
    parent_run_id: str | None = None  # set by build_report_from_mlflow


@dataclass(frozen=True)
class Analysis:
    """Every table the report renders; figures and text are drawn from these only."""

    experiment: Experiment
    scores: pd.DataFrame
    summary: pd.DataFrame
    eval_curves: tuple[pd.DataFrame, pd.DataFrame]  # (aggregated, per-seed)
    diagnostics: dict[str, tuple[pd.DataFrame, pd.DataFrame]]
    frontier: pd.DataFrame
    per_eval_set: pd.DataFrame  # eval_sets.eval_set_scores: one row per (trial, eval set)
    compute_matched: pd.DataFrame  # compute_matched.aggregate_matched: curves on common grids


def trial_rows(scores: pd.DataFrame, problems: pd.DataFrame) -> list[dict]:
    """Section `trials` (counts per arm and lag) and `problems` (one row per listed issue)."""
    rows = []
    for (arm, lag), cell in scores.groupby(["arm", "lag"], sort=True):
        keys = {"arm": str(arm), "lag": int(lag)}
        rows += [
            row("trials", "trials", len(cell), n=len(cell), **keys),
            row("trials", "scored", int(cell["scored"].sum()), n=len(cell), **keys),
            row("trials", "diverged", int(cell["diverged"].sum()), n=len(cell), **keys),
            row("trials", "seeds", cell["seed"].nunique(), n=len(cell), **keys),
        ]
    for p in problems.itertuples(index=False):
        lag = None if pd.isna(p.lag) else int(p.lag)
        arm = None if p.arm is None or pd.isna(p.arm) else str(p.arm)
        rows.append(
            row(
                "problems",
                "problem",
                float("nan"),
                arm=arm,
                lag=lag,
                comparison=str(p.trial_name),
                note=f"{p.status}: {p.problem}",
            )
        )
    return rows


def analyse(
    experiment: Experiment, config: ReportConfig, experiment_dir: Path | None = None
) -> Analysis:
    """Compute every table of the report from the loaded experiment.

    `experiment_dir` is where the experiment lives for the "what to do next" command (None:
    no command section)."""
    spec = BootstrapSpec(config.n_resamples, config.confidence, config.seed)
    scores = score_trials(experiment, config)
    scored = scores[scores["scored"]] if len(scores) else scores
    done = finished(scores) if len(scores) else scores
    raw = trial_curves(experiment.metrics, scored, mn.EVAL_PASS_RATE)
    curve_spec = BootstrapSpec(config.curve_resamples, config.confidence, config.seed)
    agg = aggregate_curves(raw, curve_spec)
    diagnostics = {}
    for label, column in DIAGNOSTICS.items():
        per_seed = bin_steps(trial_curves(experiment.metrics, done, column), config.curve_points)
        diagnostics[label] = (aggregate_curves(per_seed, None), per_seed)
    frontier = frontier_table(done, scored) if len(done) else pd.DataFrame()
    per_set = eval_set_scores(experiment.evals, scored, config)
    matched = aggregate_matched(
        matched_curves(budget_curves(experiment.metrics, completed(scored))), curve_spec
    )
    rows = trial_rows(scores, experiment.problems)
    if len(scored):
        rows += performance_rows(scored, spec)
        rows += poi_rows(scored, spec)
        rows += significance_rows(scored, spec, config.alpha)
        rows += power_rows(scored, config.alpha, config.target_power)
        rows += eval_set_rows(per_set, spec)
        rows += compute_matched_rows(matched)
    rows += stability_rows(done, spec, config.alpha, config.pass_threshold)
    rows += staleness_rows(done, scored, spec)
    rows += correction_rows(experiment.metrics, scores, spec)
    rows += curve_rows(agg, "learning_curve")
    for label, (agg_d, _) in diagnostics.items():
        rows += curve_rows(agg_d, f"curve_{label.replace(' ', '_').lower()}")
    summary = to_frame(rows)
    if experiment_dir is not None and len(scored):
        facts = launch_facts(experiment_dir, experiment.trials)
        summary = pd.concat([summary, to_frame(next_step_rows(summary, facts))], ignore_index=True)
    return Analysis(
        experiment, scores, summary, (agg, raw), diagnostics, frontier, per_set, matched
    )


def draw_figures(analysis: Analysis, config: ReportConfig, fig_dir: Path) -> dict[str, Path]:
    """Write every figure that has data; returns {name: path}."""
    agg, raw = analysis.eval_curves
    done = finished(analysis.scores) if len(analysis.scores) else analysis.scores
    colors = figures.arm_colors(list(analysis.scores["arm"])) if len(analysis.scores) else {}
    made = {
        "learning_curves": figures.learning_curves_figure(
            agg, raw, config.pass_threshold, colors, config.confidence
        ),
        "final_scores": figures.intervals_figure(analysis.summary, colors, config.confidence),
        "probability_of_improvement": figures.poi_figure(analysis.summary, config.confidence),
        "staleness_tradeoff": figures.staleness_figure(analysis.summary, analysis.frontier, colors),
        "clip_kl": figures.diagnostics_figure(analysis.diagnostics, colors),
        "corrections": corrections_figure(analysis.summary, colors, config.confidence),
        "time_to_threshold": (
            figures.survival_figure(done, config.pass_threshold, colors) if len(done) else None
        ),
        "eval_sets": eval_figures.eval_set_figure(analysis.summary, colors, config.confidence),
        "eval_aggregates": eval_figures.aggregate_figure(
            analysis.summary, colors, config.confidence
        ),
        "performance_profiles": eval_figures.profile_figure(
            analysis.summary, colors, config.confidence
        ),
        "compute_matched": eval_figures.compute_matched_figure(
            analysis.compute_matched, colors, config.confidence
        ),
    }
    return {
        name: figures.save(fig, fig_dir / f"{name}.png", config.figure_dpi)
        for name, fig in made.items()
        if fig is not None
    }


def build_report(
    root: Path,
    out_dir: Path | None = None,
    config: ReportConfig | None = None,
    *,
    experiment_dir: Path | None = None,
) -> ReportResult:
    """Load `root` (an experiment output dir with `trials/`), analyse, and write the report.

    `out_dir` defaults to `root/report`. `experiment_dir` is the directory the "what to do
    next" command extends (default `root`; a report built from MLflow passes the original).
    Broken or unfinished trials are listed in the report and in `problems`, never raised; only
    a `root` without any trial directory raises.
    """
    root, config = Path(root), config or ReportConfig()
    out_dir = Path(out_dir) if out_dir is not None else root / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    experiment = load_experiment(root)
    origin = Path(experiment_dir) if experiment_dir is not None else root.resolve()
    analysis = analyse(experiment, config, origin)
    figure_paths = (
        draw_figures(analysis, config, out_dir / "figures") if config.make_figures else {}
    )
    blocks = report_blocks(
        analysis.scores,
        analysis.summary,
        experiment.problems,
        figure_paths,
        config=config,
        default_title=root.resolve().name,
    )
    title = blocks[0].text
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    md_path.write_text(to_markdown(blocks, out_dir))
    html_path.write_text(to_html(blocks, title))
    summary_path = out_dir / "summary.parquet"
    analysis.summary.to_parquet(summary_path, index=False)
    return ReportResult(
        out_dir,
        md_path,
        html_path,
        summary_path,
        figure_paths,
        analysis.summary,
        experiment.problems,
    )
