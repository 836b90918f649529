"""What a report section is: a module that computes its rows, draws its figures, writes its text.

Every module of `analysis.sections` listed in `SECTIONS` provides (structurally, like
`Section` below):

- `analyse(inputs, prior) -> Part`: its summary rows (section.statistic.value rows of
  `analysis.summary`) and any tables its figures need;
- `draw(part, summary, colors, config) -> {name: Figure | None}`: its figures (None: no data);
- `blocks(page) -> list[Block]`: its headings, paragraphs, tables and figures, drawn from the
  summary frame only, so what a reader sees is exactly what `summary.parquet` holds;
- `METHODS`: the methods-list items that cite what it computes.

The report (`analysis.report`) draws and writes the sections in document order (`SECTIONS`) and
computes their rows in `ANALYSIS_ORDER`, where a section that restates others' rows (the
findings) comes after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
import pandas as pd

from analysis.config import ReportConfig
from analysis.loading import Experiment
from analysis.render import Block, wide_table
from analysis.stats import Aggregate, BootstrapSpec, aggregate_interval
from analysis.summary import interval_row
from analysis.trial_scores import finished

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Inputs:
    """What every section analyses: the loaded experiment and the per-trial scores."""

    experiment: Experiment
    config: ReportConfig
    scores: pd.DataFrame  # trial_scores.score_trials: one row per trial
    experiment_dir: Path | None = None  # where "what to do next" extends the experiment

    @property
    def spec(self) -> BootstrapSpec:
        """The bootstrap of every table interval."""
        c = self.config
        return BootstrapSpec(c.n_resamples, c.confidence, c.seed)

    @property
    def curve_spec(self) -> BootstrapSpec:
        """The bootstrap of curve bands (one interval per point: fewer resamples)."""
        c = self.config
        return BootstrapSpec(c.curve_resamples, c.confidence, c.seed)

    @property
    def scored(self) -> pd.DataFrame:
        """Trials with eval scores."""
        s = self.scores
        return s[s["scored"]] if len(s) else s

    @property
    def done(self) -> pd.DataFrame:
        """Trials that ran to an end (completed or diverged)."""
        return finished(self.scores) if len(self.scores) else self.scores


@dataclass(frozen=True)
class Part:
    """A section's summary rows, and the tables its figures draw (curves, frontiers)."""

    rows: list[dict] = field(default_factory=list)
    tables: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Page:
    """What a section's text is written from: the summary, the figures drawn, the config."""

    summary: pd.DataFrame
    figures: dict[str, Path]
    config: ReportConfig
    scores: pd.DataFrame  # one row per trial (trial_scores.score_trials)
    problems: pd.DataFrame  # loading.Experiment.problems: trials listed, never raised
    software_note: str | None = None  # loading.Experiment.software_note: a warning when set

    @property
    def any_scored(self) -> bool:
        return bool(len(self.scores) and self.scores["scored"].any())

    def has(self, section: str) -> bool:
        """True when the summary has rows of `section`."""
        return bool((self.summary["section"] == section).any())


class Section(Protocol):
    """The shape of a section module (see the module docstring)."""

    METHODS: list[str]

    def analyse(self, inputs: Inputs, prior: pd.DataFrame) -> Part: ...

    def draw(
        self, part: Part, summary: pd.DataFrame, colors: dict[str, str], config: ReportConfig
    ) -> dict[str, Figure | None]: ...

    def blocks(self, page: Page) -> list[Block]: ...


def table(
    summary: pd.DataFrame,
    section: str,
    title: str,
    text: str,
    *,
    skip_empty: bool = False,
    **kw: object,
) -> list[Block]:
    """A titled, explained table of one summary section; nothing when `skip_empty` and the
    section has no rows (a comparison of arms in a one-arm experiment: no axis to show)."""
    if skip_empty and not (summary["section"] == section).any():
        return []
    return [
        Block("h3", title),
        Block("p", text),
        Block("table", table=wide_table(summary, section, **kw)),
    ]


def figure(paths: dict[str, Path], name: str, caption: str) -> list[Block]:
    """The figure `name` with its caption, or nothing when it was not drawn."""
    return [Block("figure", caption, path=paths[name])] if name in paths else []


def no_figures(
    part: Part, summary: pd.DataFrame, colors: dict[str, str], config: ReportConfig
) -> dict[str, Figure | None]:
    """`draw` of a section without figures."""
    return {}


class Measure(NamedTuple):
    """One interval row per cell: `statistic` names it; `aggregate` (IQM or mean) across the
    cell's trials of `column`, the statistic's own column when None."""

    statistic: str
    aggregate: Aggregate = "mean"
    column: str | None = None


def cell_rows(
    frame: pd.DataFrame,
    section: str,
    measures: Sequence[Measure],
    spec: BootstrapSpec,
    *,
    within: str | None = None,
    keep_empty: bool = False,
) -> list[dict]:
    """Summary rows of `section`: each measure's interval per (arm, lag) cell of `frame` (one row
    per trial), cells in sorted order, each cell's measures in the order given.

    The one loop every per-condition table runs, so they cannot differ in how a cell is read:
    only its finite values count, and a measure a cell has none of gets no row (a metric that
    trial kind does not log), unless `keep_empty` (a score table lists every cell, "no scores"
    where nothing scored). `within` splits each cell further by that column (an eval set),
    whose value becomes the rows' `comparison`; its groups come in groupby order, which for a
    categorical is its category order (eval sets as the trials list them, not by name).
    """
    by = ["arm", "lag", *([within] if within else [])]
    rows = []
    for key, cell in frame.groupby(by, sort=True, observed=True):
        arm, lag = str(key[0]), int(key[1])
        comparison = str(key[2]) if within else None
        for m in measures:
            values = cell[m.column or m.statistic].to_numpy(dtype=float)
            values = values[np.isfinite(values)]
            if len(values) or keep_empty:
                interval = aggregate_interval(values, m.aggregate, spec)
                rows.append(
                    interval_row(
                        section, m.statistic, interval, arm=arm, lag=lag, comparison=comparison
                    )
                )
    return rows


def measure_rows(
    frame: pd.DataFrame, section: str, measures: Sequence[Measure], spec: BootstrapSpec
) -> list[dict]:
    """`cell_rows` measure by measure: all cells of the first, then of the next, the row order
    of a section that lists several metrics per (arm, lag)."""
    return [r for m in measures for r in cell_rows(frame, section, [m], spec)]
