"""Read each trial's per-eval-set table, or derive it from `eval/pass_rate` for older trials.

Contract with the trial side: `<trial_dir>/evals.parquet/` (a directory of Parquet parts, read
through `contract.step_tables`) holds one row per (step, eval_set) with `n_prompts`,
`greedy_pass_rate`, `samples`, `pass1_sampled` (mean sampled pass@1) and a `pass_at_<k>` column
per configured k. Trials written before eval suites existed have no such table: their single eval
set is the greedy `eval/pass_rate` of the step table, named `heldout`, so an old experiment still
reports.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from contract import metrics as mn
from contract import step_tables
from contract.evals import DEFAULT_EVAL_SET as LEGACY_EVAL_SET
from contract.evals import EVAL_SET, STEP, k_of_column
from contract.evals import GREEDY_PASS_RATE as GREEDY
from contract.evals import PASS1_SAMPLED as PASS1
from contract.layout import EVALS_DIR, TrialPaths

SCORE_COLUMNS_FIXED = (GREEDY, PASS1)
EVAL_KEYS = ["trial_name", STEP, EVAL_SET]


def is_pass_at_k(column: str) -> bool:
    return k_of_column(column) is not None


def score_columns(frame: pd.DataFrame) -> list[str]:
    """Score columns present: greedy, sampled pass@1, then pass@k by increasing k."""
    at_k = sorted((c for c in frame.columns if is_pass_at_k(c)), key=k_of_column)
    return [c for c in SCORE_COLUMNS_FIXED if c in frame.columns] + at_k


def read_evals(path: Path) -> tuple[pd.DataFrame | None, list[str]]:
    """(rows sorted by step, problems); None when the trial has no evals table.

    Parts are read under the union of their schemas (a pass@k column may appear later); a
    (step, eval_set) written twice (a resumed learner) keeps its last row; an unreadable part
    is skipped and reported, like the step table's parts.
    """
    found = step_tables.read_steps(path, strict=False)  # sorted by step, stably
    problems = list(found.problems)
    if found.table is None:
        return None, problems
    frame = found.table.to_pandas()
    if not {STEP, EVAL_SET} <= set(frame.columns):
        return None, [*problems, f"{EVALS_DIR} lacks `step` or `eval_set`: ignored"]
    keep = [STEP, EVAL_SET, *score_columns(frame)]
    frame = frame[keep].drop_duplicates([STEP, EVAL_SET], keep="last")
    frame = frame.astype({STEP: "float64", EVAL_SET: "string"})
    # within a step the rows keep the trial's order of eval sets (the config's)
    return frame.reset_index(drop=True), problems


def legacy_evals(metrics: pd.DataFrame) -> pd.DataFrame:
    """One trial's `eval/pass_rate` rows as the single eval set `heldout` (greedy only)."""
    if mn.EVAL_PASS_RATE not in metrics.columns:
        return pd.DataFrame(columns=[STEP, EVAL_SET, GREEDY])
    values = metrics[mn.EVAL_PASS_RATE].to_numpy(dtype=float)
    rows = metrics[np.isfinite(values)]
    return pd.DataFrame(
        {
            STEP: rows[mn.STEP].to_numpy(dtype=float),
            EVAL_SET: pd.array([LEGACY_EVAL_SET] * len(rows), dtype="string"),
            GREEDY: rows[mn.EVAL_PASS_RATE].to_numpy(dtype=float),
        }
    )


def trial_evals(trial_dir: Path, metrics: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The trial's eval rows (its table, else the legacy fallback) and the problems found."""
    frame, problems = read_evals(TrialPaths(trial_dir).evals)
    if frame is None or frame.empty:
        return legacy_evals(metrics), problems
    return frame, problems


def stack_evals(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """{trial_name: eval rows} to one long table keyed by trial_name, step, eval_set."""
    filled = [f.assign(trial_name=name) for name, f in frames.items() if len(f)]
    if not filled:
        return pd.DataFrame(columns=[*EVAL_KEYS, GREEDY])
    stacked = pd.concat(filled, ignore_index=True)
    scores = score_columns(stacked)
    out = stacked[[*EVAL_KEYS, *scores]]
    return out.astype({c: "float64" for c in scores})


def eval_set_names(evals: pd.DataFrame) -> list[str]:
    """Eval sets in the order trials list them (first seen = the primary set), then by name."""
    return list(dict.fromkeys(str(e) for e in evals[EVAL_SET])) if len(evals) else []
