"""Build the comparison report of one experiment: load, analyse, plot, render, write.

Public entry point: `build_report(root, out_dir, config) -> ReportResult`. Outputs in `out_dir`:
`report.md`, `report.html` (self-contained), `summary.parquet` (every number shown, long
format) and `figures/*.png`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis.config import ReportConfig
from analysis.document import report_blocks
from analysis.figures import arm_colors, save
from analysis.loading import Experiment, load_experiment
from analysis.render import to_html, to_markdown
from analysis.sections import ANALYSIS_ORDER, SECTIONS, Inputs, Page, Part, Section
from analysis.summary import to_frame
from analysis.trial_scores import score_trials

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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
    software_note: str | None = None  # the trials ran under different software (one line)


@dataclass(frozen=True)
class Analysis:
    """Every section's part, and the summary frame of all their rows."""

    inputs: Inputs
    parts: list[Part]  # one per entry of SECTIONS, in order
    summary: pd.DataFrame  # their rows in SECTIONS order


def analyse(
    experiment: Experiment, config: ReportConfig, experiment_dir: Path | None = None
) -> Analysis:
    """Compute every section's rows from the loaded experiment.

    `experiment_dir` is where the experiment lives for the "what to do next" command (None:
    no command section). Sections are computed in `ANALYSIS_ORDER`, each seeing the summary of
    the sections before it there; parts and summary come out in document order (`SECTIONS`).
    """
    inputs = Inputs(experiment, config, score_trials(experiment, config), experiment_dir)
    computed: dict[Section, Part] = {}
    summary = to_frame([])
    for section in ANALYSIS_ORDER:
        computed[section] = section.analyse(inputs, summary)
        summary = to_frame([r for part in computed.values() for r in part.rows])
    parts = [computed[section] for section in SECTIONS]
    return Analysis(inputs, parts, to_frame([r for part in parts for r in part.rows]))


def make_figures(analysis: Analysis, config: ReportConfig) -> dict[str, Figure]:
    """Every figure that has data, by name, in document order (not yet written)."""
    scores = analysis.inputs.scores
    colors = arm_colors(list(scores["arm"])) if len(scores) else {}
    made: dict[str, Figure | None] = {}
    for section, part in zip(SECTIONS, analysis.parts, strict=True):
        made |= section.draw(part, analysis.summary, colors, config)
    return {name: fig for name, fig in made.items() if fig is not None}


def draw_figures(analysis: Analysis, config: ReportConfig, fig_dir: Path) -> dict[str, Path]:
    """Write every figure that has data (`save`: titles fitted first); returns
    {name: path}. A figure an earlier build of the same report wrote and this one does not
    (its section no longer shows, e.g. a trade-off plot of a single lag) is removed, so the
    directory holds exactly the report's figures."""
    written = {
        name: save(fig, fig_dir / f"{name}.png", config.figure_dpi)
        for name, fig in make_figures(analysis, config).items()
    }
    for stale in set(fig_dir.glob("*.png")) - set(written.values()):
        stale.unlink()
    return written


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
    page = Page(
        analysis.summary,
        figure_paths,
        config,
        analysis.inputs.scores,
        experiment.problems,
        experiment.software_note,
    )
    blocks = report_blocks(page, default_title=root.resolve().name)
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
        software_note=experiment.software_note,
    )
