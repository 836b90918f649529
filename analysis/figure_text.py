"""Make a figure's text fit inside it: titles wrapped to the width they have, a figure legend in
as many columns as the figure is wide.

Constrained layout makes room for every decoration, but not for a title wider than the figure:
matplotlib centres it and cuts both ends at the canvas edge (a one-panel figure's suptitle read
"rves: IQM across seeds, band = 95% bootstrap CI; t"). So a title is wrapped at word boundaries
to the width it has, measured with the figure's renderer: the figure's for the suptitle, its
panel's for a panel title. The figure legend goes below the panels (`LEGEND_LOC`), not at their
upper right, where matplotlib puts it over the suptitle.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.artist import Artist
from matplotlib.backend_bases import RendererBase
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text

LEGEND_LOC = "outside lower center"
LEGEND_FONTSIZE = 8
EDGE_PX = 4.0  # room left between text and the figure's or the panel's edge, in pixels
FIT_PASSES = 3  # wrapping a title changes the layout, which changes the panels' widths


def wrap_to_width(text: Text, width: float, renderer: RendererBase) -> bool:
    """Rewrap `text` at word boundaries so each line is at most `width` pixels wide.

    Starts from the text on one line, so a title wrapped for a narrower layout unwraps when its
    panel widens. A single word wider than `width` stays whole (no word is cut). Returns whether
    the text changed.
    """
    before = text.get_text()
    words = before.split()
    text.set_text(" ".join(words))
    if text.get_window_extent(renderer).width <= width:
        return text.get_text() != before
    lines: list[str] = []
    line = ""
    for word in words:
        candidate = f"{line} {word}" if line else word
        text.set_text(candidate)
        if line and text.get_window_extent(renderer).width > width:
            lines.append(line)
            line = word
        else:
            line = candidate
    text.set_text("\n".join([*lines, line]))
    return text.get_text() != before


def _titles(fig: Figure) -> list[tuple[Text, float]]:
    """(title, pixels it may span): figure texts (the suptitle) over the figure, each panel
    title over its panel."""
    out = [(t, fig.bbox.width - 2 * EDGE_PX) for t in fig.texts if t.get_text()]
    for ax in fig.axes:
        if ax.get_visible() and ax.title.get_text():
            out.append((ax.title, ax.bbox.width - EDGE_PX))
    return out


def fit_text(fig: Figure) -> Figure:
    """Wrap every title of `fig` to its width after layout; returns `fig` (for chaining).

    Runs the figure's layout engine (the panels' final widths; cheaper than a full draw), wraps,
    and lays it out again until no title changes, at most FIT_PASSES times.
    """
    renderer = fig.canvas.get_renderer()
    engine = fig.get_layout_engine()
    for _ in range(FIT_PASSES):
        if engine is not None:
            engine.execute(fig)
        changed = [wrap_to_width(t, width, renderer) for t, width in _titles(fig)]
        if not any(changed):
            break
    return fig


def fitted_legend(fig: Figure, handles: Sequence[Artist], labels: Sequence[str]) -> Legend:
    """A figure legend below the panels, in as many columns (one row if it fits) as fit in the
    figure's width."""
    renderer = fig.canvas.get_renderer()
    width = fig.bbox.width - 2 * EDGE_PX
    for ncols in range(len(labels), 0, -1):
        legend = fig.legend(handles, labels, loc=LEGEND_LOC, ncols=ncols, fontsize=LEGEND_FONTSIZE)
        if ncols == 1 or legend.get_window_extent(renderer).width <= width:
            return legend
        legend.remove()
    raise ValueError("fitted_legend needs at least one label")
