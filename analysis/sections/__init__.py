"""The report's sections, one module (or folder) each, in the order the document shows them.

Each computes its summary rows, draws its figures and writes its text (`base.Section`). The
report (`analysis.report`) walks `SECTIONS`; a section shows nothing when it has no data.
"""

from __future__ import annotations

from analysis.sections import (
    comparisons,
    compute_matched,
    corrections,
    eval_aggregates,
    eval_sets,
    final_scores,
    next_steps,
    stability,
    staleness,
    trials,
)
from analysis.sections.base import Inputs, Page, Part, Section

SECTIONS: tuple[Section, ...] = (
    trials,
    eval_aggregates,  # the headline when there are several eval sets
    final_scores,
    eval_sets,
    comparisons,
    compute_matched,
    next_steps,  # reads the Power rows of `comparisons`
    stability,
    staleness,
    corrections,
)

__all__ = ["SECTIONS", "Inputs", "Page", "Part", "Section"]
