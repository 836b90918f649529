"""Every figure of a 4-arm x 5-lag report and of a quickstart-shaped one (four arms, lag 0 only)
keeps its text inside the canvas and its legend clear of every title and panel.

Issue 37: the quickstart's titles were cut at both edges and its legends sat on them. The
figures are checked as `figures.save` writes them (titles wrapped by `figure_text.fit_text`),
from the renderer's window extents: no browser, no pixels. Two hand-made figures show that
the check catches both faults.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from analysis import ReportConfig, figures
from analysis.figure_text import fit_text, fitted_legend, wrap_to_width
from analysis.figures_tuning import expected_max_figure, sensitivity_figure
from analysis.loading import load_experiment
from analysis.report import analyse, make_figures
from analysis.synthetic import write_experiment
from tests.analysis.experiments import FOUR_BY_FIVE, QUICKSTART_SHAPED
from tests.analysis.test_figures_tuning import curves, table

CONFIG = ReportConfig(n_resamples=100, curve_resamples=100, figure_dpi=50)
TOLERANCE_PX = 1.0
LONG_TITLE = "Learning curves: IQM across seeds, band = 95% bootstrap CI; thin lines = seeds"


def _drawn_tick_labels(axis: Axis) -> list[Text]:
    """Tick labels of the ticks inside the view interval: matplotlib keeps ticks just outside
    it, undrawn, whose labels would read as clipped."""
    low, high = sorted(axis.get_view_interval())
    slack = (high - low) * 1e-9
    ticks = axis.get_major_ticks() + axis.get_minor_ticks()
    inside = [t for t in ticks if low - slack <= t.get_loc() <= high + slack]
    return [label for t in inside for label in (t.label1, t.label2)]


def text_artists(fig: Figure) -> list[Text]:
    """Every visible, non-empty text the figure draws: figure texts (the suptitle), legend
    entries, and each visible panel's title, axis labels, offset texts, annotations and ticks."""
    out = list(fig.texts)
    for legend in fig.legends:
        out += [*legend.get_texts(), legend.get_title()]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        out += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        out += [ax.xaxis.get_offset_text(), ax.yaxis.get_offset_text()]
        out += _drawn_tick_labels(ax.xaxis) + _drawn_tick_labels(ax.yaxis)
        if ax.get_legend() is not None:
            out += ax.get_legend().get_texts()
    return [t for t in out if t.get_visible() and t.get_text().strip()]


def _inside(box: Bbox, frame: Bbox) -> bool:
    return (
        box.x0 >= frame.x0 - TOLERANCE_PX
        and box.y0 >= frame.y0 - TOLERANCE_PX
        and box.x1 <= frame.x1 + TOLERANCE_PX
        and box.y1 <= frame.y1 + TOLERANCE_PX
    )


def layout_problems(fig: Figure) -> list[str]:
    """Texts reaching past the figure's edge; legends over a title, a panel or each other."""
    fig.draw_without_rendering()  # lay out as savefig does
    renderer = fig.canvas.get_renderer()
    problems = [
        f"text cut at the edge: {t.get_text()!r}"
        for t in text_artists(fig)
        if not _inside(t.get_window_extent(renderer), fig.bbox)
    ]
    panels = [ax for ax in fig.axes if ax.get_visible()]
    titles = [t for t in fig.texts if t.get_text()] + [ax.title for ax in panels]
    legends = fig.legends + [ax.get_legend() for ax in panels if ax.get_legend() is not None]
    boxes = [legend.get_window_extent(renderer) for legend in legends]
    for box in boxes:
        problems += [
            f"legend over title {t.get_text()!r}"
            for t in titles
            if t.get_text() and box.overlaps(t.get_window_extent(renderer))
        ]
        problems += [
            f"legend over panel {ax.get_title()!r}"
            for ax in panels
            if ax.get_legend() is None and box.overlaps(ax.get_window_extent(renderer))
        ]
    problems += [
        "legends overlap" for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)
    ]
    return problems


@pytest.mark.parametrize(
    ("spec", "expected"),
    [(FOUR_BY_FIVE, 11), (QUICKSTART_SHAPED, 9)],
    ids=["4_arms_x_5_lags", "quickstart_shaped"],
)
def test_every_report_figure_fits_with_its_legend_clear(spec, expected, tmp_path: Path) -> None:
    analysis = analyse(load_experiment(write_experiment(tmp_path / "exp", spec)), CONFIG)
    made = make_figures(analysis, CONFIG)
    assert len(made) == expected  # one lag: no staleness trade-off, no corrections figure
    # `figures.save` fits the text (`fit_text`) and writes the PNG: the writing is left out here
    problems = {name: layout_problems(fit_text(fig)) for name, fig in made.items()}
    assert {name: found for name, found in problems.items() if found} == {}


def test_tuning_figures_fit_with_their_legend_clear() -> None:
    # drawn only with a tuning stage, so not in the reports above
    for fig in (expected_max_figure(curves()), sensitivity_figure(table())):
        assert layout_problems(fit_text(fig)) == []


def _one_panel(title: str) -> Figure:
    fig = Figure(figsize=(4.2, 3.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, arm in enumerate(("gspo", "grpo", "ppo", "grpo_lr_tenth")):
        ax.plot([0, 1], [i, i + 1], label=arm)
    ax.set_title("lag 0")
    fig.suptitle(title)
    return fig


def test_the_check_catches_a_cut_title_and_a_legend_on_it() -> None:
    # matplotlib's own placement, as before issue 37: cut at both edges, legend on the title
    fig = _one_panel(LONG_TITLE)
    fig.legend(loc="outside right upper", fontsize=8)
    found = layout_problems(fig)
    assert f"text cut at the edge: {LONG_TITLE!r}" in found
    assert f"legend over title {LONG_TITLE!r}" in found
    fixed = _one_panel(LONG_TITLE)
    figures.outside_legend(fixed, fixed.axes)
    assert layout_problems(fit_text(fixed)) == []


def test_wrap_to_width_breaks_at_words_and_unwraps_when_there_is_room() -> None:
    fig = _one_panel(LONG_TITLE)
    renderer = fig.canvas.get_renderer()
    title = fig.texts[0]
    assert wrap_to_width(title, 200.0, renderer)
    lines = title.get_text().split("\n")
    assert len(lines) >= 3 and " ".join(lines) == LONG_TITLE  # no word lost or cut
    for line in lines:
        probe = fig.text(0, 0, line, fontproperties=title.get_fontproperties())
        assert probe.get_window_extent(renderer).width <= 200.0
        probe.remove()
    assert wrap_to_width(title, 10_000.0, renderer)  # room again: back on one line
    assert title.get_text() == LONG_TITLE
    assert not wrap_to_width(title, 10_000.0, renderer)  # nothing to change


def test_fitted_legend_takes_as_many_columns_as_fit() -> None:
    wide, narrow = _one_panel("t"), Figure(figsize=(1.5, 3.2), layout="constrained")
    FigureCanvasAgg(narrow)
    handles, labels = wide.axes[0].get_legend_handles_labels()
    renderer = wide.canvas.get_renderer()
    one_row = fitted_legend(wide, handles, labels).get_window_extent(renderer)
    stacked = fitted_legend(narrow, handles, labels).get_window_extent(renderer)
    assert one_row.width <= wide.bbox.width and stacked.width <= narrow.bbox.width
    assert stacked.height > 1.5 * one_row.height  # 1.5 in cannot hold the 4 arms in one row
