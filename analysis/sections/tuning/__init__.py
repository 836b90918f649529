"""Section "Tuning": how each arm's configuration was chosen, and how much the choice mattered.

Present only when the experiment ran a tuning stage, i.e. `<exp>/tuning/selection.json` exists
(written by the harness with `<exp>/tuning/tuning_scores.parquet`): every arm tried the same
budget of B configurations on the tuning seeds, each scored on the validation set; the best
configuration per arm went on to the final trials on fresh evaluation seeds. An equal budget is
not yet a fair comparison: an arm can win at 3 tried configurations and lose at 30 (Dodge et al.
2019), so the section shows each arm's expected validation performance (EVP) at every budget
1..B, from the unbiased estimator over the per-configuration tuning scores (Dodge et al. 2021),
which arm leads at each budget, and how the score depends on each hyperparameter.

Summary sections (rows), computed in `rows`, written up in `text`:

- `tuning_protocol`: budget, tuning and evaluation seeds (the `seeds` column; the note lists
  them), validation set, selection metric;
- `tuning_selected`: per arm, the selected configuration (value: its index; note: its
  settings), its tuning score (n: seeds it counts), and the budget;
- `tuning_evp`: per arm and budget (the `budget` column; `comparison` = 'budget n'),
  `expected_max` and `expected_max_std` (the spread of the tuned score across tuning runs, not
  a CI);
- `tuning_ranking`: per budget, the leading arm (`leader`, value its expected max), and one
  `winner_changes` row (1 or 0) whose note says when the leader changes or that it does not;
- `tuning_sensitivity`: per arm and hyperparameter value (`comparison` = '<name> = <value>'),
  the mean score over tuning seeds with a percentile-bootstrap interval across seeds.

Configurations that failed on every tuning seed have no score; they are left out of the EVP
curve (its N is the configurations that have one), and the `budget` row's note counts them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from analysis.config import ReportConfig
from analysis.figures_tuning import expected_max_figure, sensitivity_figure
from analysis.render import Block
from analysis.sections.base import Inputs, Page, Part
from analysis.sections.tuning.rows import (
    evp_curves,
    evp_rows,
    protocol_rows,
    ranking_rows,
    selected_rows,
    selected_seed_se,
    sensitivity_frame,
    sensitivity_rows,
    tuning_paths,
)
from analysis.sections.tuning.text import tuning_blocks
from contract.tuning import TuningSelection

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The report's Methods list takes every section's METHODS whether or not the section has rows,
# and a report without a tuning stage must not change: the section lists its methods itself
# (`text.TUNING_METHODS`).
METHODS: list[str] = []


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """Every tuning row; nothing when the experiment had no tuning stage."""
    paths = tuning_paths(inputs.experiment_dir)
    if paths is None:
        return Part()
    selection_path, scores_path = paths
    selection = TuningSelection.read(selection_path)
    curves = evp_curves(selection)
    spec = inputs.spec
    sensitivity = sensitivity_frame(scores_path, spec.seed, spec.confidence, spec.n_resamples)
    rows = (
        protocol_rows(selection)
        + selected_rows(selection)
        + evp_rows(curves)
        + ranking_rows(curves, selected_seed_se(selection, scores_path))
        + sensitivity_rows(sensitivity)
    )
    return Part(rows, {"curves": curves, "sensitivity": sensitivity})


def draw(
    part: Part, summary: pd.DataFrame, colors: dict[str, str], config: ReportConfig
) -> dict[str, Figure | None]:
    """The EVP curves and the sensitivity panels (nothing without a tuning stage)."""
    if not part.rows:
        return {}
    curves = part.tables["curves"]
    sensitivity = part.tables["sensitivity"]
    return {
        "tuning_evp": expected_max_figure(curves) if curves else None,
        "tuning_sensitivity": (
            sensitivity_figure(sensitivity, confidence=config.confidence)
            if len(sensitivity)
            else None
        ),
    }


def blocks(page: Page) -> list[Block]:
    """Protocol, selected configurations, EVP curves and sensitivity; nothing without tuning."""
    return tuning_blocks(page)


__all__ = ["METHODS", "analyse", "blocks", "draw"]
