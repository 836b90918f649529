"""The Tuning section's summary rows, from `<exp>/tuning/selection.json` (a
`contract.tuning.TuningSelection`) and `<exp>/tuning/tuning_scores.parquet`.

Rows that are at a budget carry it in the `budget` column, rows that list seeds carry them in
`seeds`; `comparison` and `note` say the same for a reader, and nothing reads them back.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.stats.expected_max import (
    BudgetRanking,
    ExpectedMaxCurve,
    budget_ranking,
    expected_max_curve,
    sensitivity_table,
)
from analysis.summary import row
from contract.layout import TUNING_DIR, TUNING_SCORES, TUNING_SELECTION
from contract.tuning import ArmSelection, TuningSelection

PARAM_PREFIX = "param."
ESTIMATOR = "unbiased"


def tuning_paths(experiment_dir: Path | None) -> tuple[Path, Path] | None:
    """(selection.json, tuning_scores.parquet) of the experiment, or None without a tuning
    stage (no experiment dir, or no selection.json in it)."""
    if experiment_dir is None:
        return None
    folder = Path(experiment_dir) / TUNING_DIR
    selection = folder / TUNING_SELECTION
    return (selection, folder / TUNING_SCORES) if selection.is_file() else None


def value_text(value: object) -> str:
    """A hyperparameter value as the report writes it: numbers with %g, anything else as is."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        return str(value)
    return f"{float(value):g}"


def settings_text(settings: dict) -> str:
    """'lr=1e-05, eps_high=0.28' in the order the harness wrote them."""
    return ", ".join(f"{name}={value_text(v)}" for name, v in settings.items())


def seeds_text(seeds: list[int]) -> str:
    """'100, 101': seeds as the report lists them."""
    return ", ".join(map(str, seeds))


def protocol_rows(selection: TuningSelection) -> list[dict]:
    """Section `tuning_protocol`: what every arm was tuned with and on."""
    validation = selection.validation
    task = f"task {validation.task}"
    seeds, evaluation = selection.seeds, selection.evaluation_seeds
    section = "tuning_protocol"
    return [
        row(section, "budget", selection.budget, n=selection.budget),
        row(section, "tuning_seeds", len(seeds), note=seeds_text(seeds), seeds=seeds),
        row(
            section,
            "evaluation_seeds",
            len(evaluation),
            note=seeds_text(evaluation),
            seeds=evaluation,
        ),
        row(section, "validation_offset", validation.offset, note=task),
        row(section, "validation_size", validation.size, note=task),
        row(section, "selection_metric", math.nan, note=selection.metric),
    ]


def config_scores(arm: ArmSelection) -> np.ndarray:
    """The tuning score of each configuration an arm tried, in index order (NaN: none)."""
    configs = sorted(arm.configs, key=lambda c: c.index)
    return np.array([c.score for c in configs], dtype=float)


def selected_rows(selection: TuningSelection) -> list[dict]:
    """Section `tuning_selected`: per arm, the chosen configuration, its score and the budget."""
    rows = []
    for name in sorted(selection.arms):
        arm = selection.arms[name]
        chosen = arm.chosen()
        n_seeds = None if chosen is None else chosen.n_seeds
        scores = config_scores(arm)
        failed = int((~np.isfinite(scores)).sum())
        budget_note = f"{failed} failed on every tuning seed (no score)" if failed else ""
        settings = settings_text(arm.settings)
        rows += [
            row("tuning_selected", "selected_config", arm.selected, arm=name, note=settings),
            row("tuning_selected", "tuning_score", arm.score, arm=name, n=n_seeds),
            row(
                "tuning_selected", "budget", len(scores), arm=name, n=len(scores), note=budget_note
            ),
        ]
    return rows


def evp_curves(selection: TuningSelection) -> dict[str, ExpectedMaxCurve]:
    """The unbiased expected-max curve of every arm with at least one scored configuration."""
    curves = {}
    for name in sorted(selection.arms):
        scores = config_scores(selection.arms[name])
        scores = scores[np.isfinite(scores)]
        if len(scores):
            curves[name] = expected_max_curve(scores, estimator=ESTIMATOR)
    return curves


def budget_keys(budget: int) -> dict:
    """The keys of a row at `budget` configurations tried: the typed column and the label."""
    return {"budget": budget, "comparison": f"budget {budget}"}


def evp_rows(curves: dict[str, ExpectedMaxCurve]) -> list[dict]:
    """Section `tuning_evp`: expected max and its std at budgets 1..N per arm."""
    rows = []
    for name, curve in curves.items():
        n = curve.n_configurations
        for budget, mean, std in zip(curve.budgets, curve.mean, curve.std, strict=True):
            keys = {"arm": name, **budget_keys(int(budget)), "n": n}
            rows += [
                row("tuning_evp", "expected_max", mean, **keys),
                row("tuning_evp", "expected_max_std", std, **keys),
            ]
    return rows


def no_change_note(ranking: BudgetRanking) -> str:
    """The sentence for a ranking whose sole leader never changes."""
    last = ranking.budgets[-1]
    sole = sorted({top[0] for top in ranking.leaders if len(top) == 1})
    if not sole:
        return f"The arms tie at every budget from 1 to {last}."
    ties = ""
    if ranking.ties:
        ties = " (tied at budget " + ", ".join(str(b) for b, _ in ranking.ties) + ")"
    return (
        f"The winner does not change with the budget: {sole[0]} leads at every budget from 1 "
        f"to {last}{ties}."
    )


def ranking_rows(curves: dict[str, ExpectedMaxCurve], seed_se: float = math.nan) -> list[dict]:
    """Section `tuning_ranking`: the leader at each budget 1..min N with its margin over the
    runner-up, whether the leader changes, and `seed_se`: the largest standard error over
    tuning seeds of a selected configuration's tuning score, the noise a margin is read
    against (a lead smaller than it is not established)."""
    if not curves:
        return []
    ranking = budget_ranking(curves)
    rows = []
    for budget, top in zip(ranking.budgets, ranking.leaders, strict=True):
        value = float(curves[top[0]].mean[budget - 1])
        note = top[0] if len(top) == 1 else "tie: " + ", ".join(top)
        arm = top[0] if len(top) == 1 else None
        keys = {**budget_keys(int(budget)), "n": len(curves), "note": note}
        rows.append(row("tuning_ranking", "leader", value, arm=arm, **keys))
        others = sorted((float(c.mean[budget - 1]) for a, c in curves.items() if a not in top))
        margin = value - others[-1] if others else math.nan
        rows.append(row("tuning_ranking", "margin", margin, arm=arm, **keys))
    rows.append(
        row(
            "tuning_ranking",
            "seed_se",
            seed_se,
            comparison="selected configurations",
            n=len(curves),
            note="largest standard error over tuning seeds of a selected configuration's score",
        )
    )
    note = ranking.note() or no_change_note(ranking)
    rows.append(
        row(
            "tuning_ranking",
            "winner_changes",
            float(ranking.winner_changes),
            comparison="every budget",
            n=len(ranking.budgets),
            note=note,
        )
    )
    return rows


def selected_seed_se(selection: TuningSelection, path: Path) -> float:
    """The largest standard error (sample SD / sqrt(n) over tuning seeds) of the selected
    configurations' tuning scores; NaN without the scores file or with fewer than 2 seeds."""
    if not path.exists():
        return math.nan
    trials = pd.read_parquet(path)
    errors = []
    for arm, entry in selection.arms.items():
        mine = trials[(trials["arm"] == arm) & (trials["config"] == entry.selected)]
        scores = pd.to_numeric(mine["score"], errors="coerce").dropna().to_numpy(dtype=float)
        if len(scores) >= 2:
            errors.append(float(np.std(scores, ddof=1) / math.sqrt(len(scores))))
    return max(errors) if errors else math.nan


def sensitivity_frame(
    path: Path, spec_seed: int, confidence: float, resamples: int
) -> pd.DataFrame:
    """`sensitivity_table` of the finished tuning trials (hyperparameters without the `param.`
    prefix); empty when there is no file, no finished trial or no hyperparameter column."""
    if not path.exists():
        return pd.DataFrame()
    trials = pd.read_parquet(path)
    params = [c for c in trials.columns if c.startswith(PARAM_PREFIX)]
    scores = pd.to_numeric(trials["score"], errors="coerce").to_numpy(dtype=float)
    trials = trials[np.isfinite(scores)]
    if not params or trials.empty:
        return pd.DataFrame()
    taken = set(trials.columns)
    names = {p: p.removeprefix(PARAM_PREFIX) for p in params}
    names = {p: n if n not in taken else p for p, n in names.items()}
    trials = trials.rename(columns=names).astype({"arm": str})
    return sensitivity_table(
        trials,
        param_cols=list(names.values()),
        confidence=confidence,
        seed=spec_seed,
        n_resamples=resamples,
    )


def sensitivity_rows(table: pd.DataFrame) -> list[dict]:
    """Section `tuning_sensitivity`: one row per (arm, hyperparameter, value)."""
    return [
        row(
            "tuning_sensitivity",
            "mean_score",
            r.mean,
            arm=str(r.arm),
            comparison=f"{r.param} = {value_text(r.value)}",
            ci_low=r.low,
            ci_high=r.high,
            n=int(r.n_seeds),
            note=str(r.note),
        )
        for r in table.itertuples(index=False)
    ]
