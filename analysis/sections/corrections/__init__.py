"""Section "Off-policy corrections and staleness": correction x lag tables, figure and text.

`tables` reduces each trial's step table and aggregates per (arm, lag); `figure` draws the
diagnostics against lag; `text` writes the section from summary section `corrections`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from analysis.config import ReportConfig
from analysis.render import Block
from analysis.sections.base import Inputs, Page, Part
from analysis.sections.corrections.figure import corrections_figure
from analysis.sections.corrections.tables import (
    correction_rows,
    groups_per_step,
    run_bias,
    trial_reductions,
)
from analysis.sections.corrections.text import correction_blocks

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "METHODS",
    "analyse",
    "blocks",
    "correction_rows",
    "draw",
    "groups_per_step",
    "run_bias",
    "trial_reductions",
]
METHODS: list[str] = []


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    return Part(correction_rows(inputs.experiment.metrics, inputs.scores, inputs.spec))


def draw(
    part: Part, summary: pd.DataFrame, colors: dict[str, str], config: ReportConfig
) -> dict[str, Figure | None]:
    return {"corrections": corrections_figure(summary, colors, config.confidence)}


def blocks(page: Page) -> list[Block]:
    return correction_blocks(page.summary, page.figures)
