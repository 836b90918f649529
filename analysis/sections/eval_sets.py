"""Section "Scores per eval set": each eval set's scores across seeds (summary `eval_set_scores`).

Per trial and eval set: the final score (mean of the last K evals, as for the primary score) of
each measured score (greedy pass rate, sampled pass@1, pass@k) and the AUC of the greedy curve.
A diverged trial is scored as in `trial_scores.score_trial`: final 0, greedy AUC over the planned
span with 0 after divergence. Across seeds: IQM with a bootstrap interval per eval set. The
aggregates across eval sets are the section `eval_aggregates`, on the same per-trial scores.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.config import ReportConfig
from analysis.eval_tables import EVAL_SET, GREEDY, PASS1, STEP, eval_set_names, is_pass_at_k
from analysis.figures import arm_colors, interval_grid
from analysis.render import Block
from analysis.sections.base import Inputs, Measure, Page, Part, cell_rows, figure, table
from analysis.stats import BootstrapSpec
from analysis.trial_scores import area_under_curve, diverged_curve, final_score

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEADLINE = "final_greedy"  # the score the aggregates, profiles and PoI across eval sets use
METHODS: list[str] = []


def score_name(column: str) -> str:
    """`greedy_pass_rate` -> `final_greedy`, `pass1_sampled` -> `final_pass1`, `pass_at_k` kept."""
    if column == GREEDY:
        return "final_greedy"
    if column == PASS1:
        return "final_pass1"
    return f"final_{column}"


def _trial_set_scores(
    rows: pd.DataFrame, last_k: int, diverged: bool, last_step: float, planned: float
) -> dict[str, float]:
    out: dict[str, float] = {}
    for column in [c for c in rows.columns if c in (GREEDY, PASS1) or is_pass_at_k(c)]:
        measured = rows[np.isfinite(rows[column].to_numpy(dtype=float))]
        values = measured[column].to_numpy(dtype=float)
        out[score_name(column)] = 0.0 if diverged and len(values) else final_score(values, last_k)
        if column == GREEDY:
            steps = measured[STEP].to_numpy(dtype=float)
            if diverged and len(values):
                steps, values = diverged_curve(steps, values, last_step, planned)
            out["auc_greedy"] = area_under_curve(steps, values)
    return out


def eval_set_scores(
    evals: pd.DataFrame, scored: pd.DataFrame, config: ReportConfig
) -> pd.DataFrame:
    """One row per (scored trial, eval set): arm, lag, seed, trial_name, eval_set, scores."""
    if evals.empty or scored.empty:
        return pd.DataFrame(columns=["arm", "lag", "seed", "trial_name", EVAL_SET])
    info = scored.set_index("trial_name")
    out = []
    for (name, eval_set), rows in evals[evals["trial_name"].isin(info.index)].groupby(
        ["trial_name", EVAL_SET], sort=False
    ):
        trial = info.loc[name]
        planned = math.nan if pd.isna(trial["steps_planned"]) else float(trial["steps_planned"])
        scores = _trial_set_scores(
            rows.sort_values(STEP),
            config.last_k_evals,
            bool(trial["diverged"]),
            float(trial["last_step"]),
            planned,
        )
        keys = {"arm": trial["arm"], "lag": int(trial["lag"]), "seed": trial["seed"]}
        out.append({**keys, "trial_name": name, EVAL_SET: str(eval_set), **scores})
    return pd.DataFrame(out)


def set_score_columns(per_set: pd.DataFrame) -> list[str]:
    """Score columns of `eval_set_scores`, greedy first and pass@k by k."""
    names = [c for c in per_set.columns if c.startswith(("final_", "auc_"))]
    order = {"final_greedy": 0, "auc_greedy": 1, "final_pass1": 2}

    def key(name: str) -> tuple[int, int]:
        k = re.search(r"_(\d+)$", name)
        return order.get(name, 3), int(k.group(1)) if k else 0

    return sorted(names, key=key)


def per_set_rows(per_set: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `eval_set_scores`: IQM across seeds of each score, per (arm, lag, eval set)."""
    ordered = pd.Categorical(per_set[EVAL_SET], categories=eval_set_names(per_set))
    measures = [Measure(column, "iqm") for column in set_score_columns(per_set)]
    frame = per_set.assign(**{EVAL_SET: ordered})
    return cell_rows(frame, "eval_set_scores", measures, spec, within=EVAL_SET)


def task_matrix(cell: pd.DataFrame, column: str, sets: list[str]) -> list[np.ndarray]:
    """Per-eval-set arrays of `column` over the cell's seeds (a seed run twice counts once)."""
    wide = cell.pivot_table(index="seed", columns=EVAL_SET, values=column, aggfunc="mean")
    return [
        wide[s].to_numpy(dtype=float) if s in wide.columns else np.array([], dtype=float)
        for s in sets
    ]


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """Section `eval_set_scores` (per-set scores; also shown for a single eval set)."""
    per_set = eval_set_scores(inputs.experiment.evals, inputs.scored, inputs.config)
    return Part(per_set_rows(per_set, inputs.spec) if len(per_set) else [])


def eval_set_count(summary: pd.DataFrame) -> int:
    """How many eval sets the per-set table holds (0 when nothing was scored)."""
    part = summary[summary["section"] == "eval_set_scores"]
    return int(part["comparison"].nunique()) if len(part) else 0


def cell_height(cells: pd.DataFrame) -> float:
    """Panel height for one interval bar per (arm, lag), so 6 arms x 5 lags stay legible."""
    return 0.28 * cells["arm"].nunique() * cells["lag"].nunique() + 1.2


def colors_for(cells: pd.DataFrame, colors: dict[str, str] | None) -> dict[str, str]:
    return colors or arm_colors(list(cells["arm"].dropna().unique()))


def eval_set_figure(
    summary: pd.DataFrame, colors: dict[str, str] | None = None, confidence: float = 0.95
) -> Figure | None:
    """Final greedy score per eval set: one panel per set, IQM across seeds with CIs (None with
    a single set)."""
    cells = summary[(summary["section"] == "eval_set_scores") & (summary["statistic"] == HEADLINE)]
    if cells.empty:
        return None
    sets = list(dict.fromkeys(cells["comparison"]))
    if len(sets) < 2:  # one set: the final-score figure already shows it
        return None
    panels = [
        (f"{name}: final greedy pass rate", cells[cells["comparison"] == name]) for name in sets
    ]
    title = f"Final score per eval set: IQM across seeds, {confidence:.0%} bootstrap CI"
    colors = colors_for(cells, colors)
    return interval_grid(panels, colors, title, width=4.6, height=cell_height(cells), max_cols=3)


def draw(
    part: Part, summary: pd.DataFrame, colors: dict[str, str], config: ReportConfig
) -> dict[str, Figure | None]:
    return {"eval_sets": eval_set_figure(summary, colors, config.confidence)}


def blocks(page: Page) -> list[Block]:
    """Per-eval-set scores (shown for one eval set too: pass@1 and pass@k live here)."""
    if not page.any_scored:
        return []
    return [
        *table(
            page.summary,
            "eval_set_scores",
            "Scores per eval set",
            "IQM across seeds with CI of: final greedy pass rate, greedy AUC, final sampled "
            "pass@1 and pass@k (unbiased estimator, Chen et al. 2021), per eval set "
            "(comparison column). n = seeds.",
        ),
        *figure(page.figures, "eval_sets", "Final greedy score per eval set."),
    ]
