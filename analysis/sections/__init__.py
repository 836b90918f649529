"""The report's sections, one module (or folder) each, in the order the document shows them.

Each computes its summary rows, draws its figures and writes its text (`base.Section`). The
report (`analysis.report`) computes them in `ANALYSIS_ORDER` and shows them in `SECTIONS`
order; a section shows nothing when it has no data.
"""

from __future__ import annotations

from analysis.sections import (
    claims,
    comparisons,
    compute_matched,
    corrections,
    eval_aggregates,
    eval_sets,
    final_scores,
    findings,
    lag_effects,
    next_steps,
    samples,
    stability,
    staleness,
    trials,
    tuning,
)
from analysis.sections.base import Inputs, Page, Part, Section

SECTIONS: tuple[Section, ...] = (
    findings,  # opens the report, above the overview; reads the rows of `comparisons`
    trials,
    tuning,  # only with a tuning stage (<exp>/tuning/selection.json)
    eval_aggregates,  # the headline when there are several eval sets
    final_scores,
    samples,  # only when trials have a rollout log (rollouts.parquet/)
    eval_sets,
    comparisons,
    lag_effects,  # only with a lag axis: each arm's lags against its smallest
    claims,  # Holm over every Findings line; reads comparisons and lag_effects
    compute_matched,
    next_steps,  # reads the Power rows of `comparisons`
    stability,
    staleness,
    corrections,
)
# The order the sections' rows are computed in: each section sees the rows of those before it
# here, so the findings, which only restate the other sections' numbers, come last.
ANALYSIS_ORDER: tuple[Section, ...] = (*(s for s in SECTIONS if s is not findings), findings)

__all__ = ["ANALYSIS_ORDER", "SECTIONS", "Inputs", "Page", "Part", "Section"]
