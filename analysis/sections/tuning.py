"""Section "Tuning": how each arm's configuration was chosen, and how much the choice mattered.

Present only when the experiment ran a tuning stage, i.e. `<exp>/tuning/selection.json` exists
(written by the harness with `<exp>/tuning/tuning_scores.parquet`): every arm tried the same
budget of B configurations on the tuning seeds, each scored on the validation set; the best
configuration per arm went on to the final trials on fresh evaluation seeds. An equal budget is
not yet a fair comparison: an arm can win at 3 tried configurations and lose at 30 (Dodge et al.
2019), so the section shows each arm's expected validation performance (EVP) at every budget
1..B, from the unbiased estimator over the per-configuration tuning scores (Dodge et al. 2021),
which arm leads at each budget, and how the score depends on each hyperparameter.

Summary sections (rows):

- `tuning_protocol`: budget, tuning and evaluation seeds, validation set, selection metric;
- `tuning_selected`: per arm, the selected configuration (value: its index; note: its
  settings), its tuning score (n: seeds it counts), and the budget;
- `tuning_evp`: per arm and budget (`comparison` = 'budget n'), `expected_max` and
  `expected_max_std` (the spread of the tuned score across tuning runs, not a CI);
- `tuning_ranking`: per budget, the leading arm (`leader`, value its expected max), and one
  `winner_changes` row (1 or 0) whose note says when the leader changes or that it does not;
- `tuning_sensitivity`: per arm and hyperparameter value (`comparison` = '<name> = <value>'),
  the mean score over tuning seeds with a percentile-bootstrap interval across seeds.

Configurations that failed on every tuning seed have no score; they are left out of the EVP
curve (its N is the configurations that have one), and the `budget` row's note counts them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.config import ReportConfig
from analysis.figures_tuning import expected_max_figure, sensitivity_figure
from analysis.render import Block, format_number, wide_table
from analysis.sections.base import Inputs, Page, Part, figure
from analysis.stats.expected_max import (
    BudgetRanking,
    ExpectedMaxCurve,
    budget_ranking,
    expected_max_curve,
    sensitivity_table,
)
from analysis.summary import row
from contract.layout import TUNING_DIR, TUNING_SCORES, TUNING_SELECTION

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PARAM_PREFIX = "param."
ESTIMATOR = "unbiased"
METRIC_TEXT = {
    "final": "the score at the end of training",
    "auc": "the area under the validation curve",
}
# The report's Methods list takes every section's METHODS whether or not the section has rows,
# and a report without a tuning stage must not change: the section lists its methods itself.
METHODS: list[str] = []
TUNING_METHODS = [
    "Tuning: every arm gets the same budget of configurations, chosen on a validation set with "
    "tuning seeds, and the final comparison runs the chosen configurations on fresh seeds "
    "(Jordan et al. 2020, 'Evaluating the Performance of Reinforcement Learning Algorithms', "
    "ICML; Patterson et al. 2024, 'Empirical Design in Reinforcement Learning', JMLR). Expected "
    "validation performance, the expected best score after n configurations, against n: Dodge "
    "et al. 2019, 'Show Your Work: Improved Reporting of Experimental Results', EMNLP; "
    "estimated with the unbiased estimator (the average over all size-n subsets of the tried "
    "configurations of their best score) of Dodge et al. 2021, 'Expected Validation Performance "
    "and Estimation of a Random Variable's Maximum', Findings of EMNLP. Sensitivity: mean score "
    "per hyperparameter value over tuning seeds, percentile bootstrap over seeds.",
]


def tuning_paths(experiment_dir: Path | None) -> tuple[Path, Path] | None:
    """(selection.json, tuning_scores.parquet) of the experiment, or None without a tuning
    stage (no experiment dir, or no selection.json in it)."""
    if experiment_dir is None:
        return None
    folder = Path(experiment_dir) / TUNING_DIR
    selection = folder / TUNING_SELECTION
    return (selection, folder / TUNING_SCORES) if selection.is_file() else None


def _number(value: object) -> float:
    """A JSON score: null (or anything non-numeric) is NaN."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def value_text(value: object) -> str:
    """A hyperparameter value as the report writes it: numbers with %g, anything else as is."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        return str(value)
    return f"{float(value):g}"


def settings_text(settings: dict) -> str:
    """'lr=1e-05, eps_high=0.28' in the order the harness wrote them."""
    return ", ".join(f"{name}={value_text(v)}" for name, v in settings.items())


def read_selection(path: Path) -> dict:
    """selection.json, checked for the keys the section reads."""
    data = json.loads(path.read_text())
    needed = ["metric", "validation", "budget", "seeds", "evaluation_seeds", "arms"]
    missing = [key for key in needed if key not in data]
    if missing or not isinstance(data.get("arms"), dict):
        raise ValueError(f"{path}: tuning selection lacks {missing or ['arms (a mapping)']}")
    return data


def protocol_rows(selection: dict) -> list[dict]:
    """Section `tuning_protocol`: what every arm was tuned with and on."""
    validation = selection["validation"]
    task = f"task {validation['task']}"
    seeds = [int(s) for s in selection["seeds"]]
    evaluation = [int(s) for s in selection["evaluation_seeds"]]
    section = "tuning_protocol"
    return [
        row(section, "budget", int(selection["budget"]), n=int(selection["budget"])),
        row(section, "tuning_seeds", len(seeds), note=", ".join(map(str, seeds))),
        row(section, "evaluation_seeds", len(evaluation), note=", ".join(map(str, evaluation))),
        row(section, "validation_offset", int(validation["offset"]), note=task),
        row(section, "validation_size", int(validation["size"]), note=task),
        row(section, "selection_metric", math.nan, note=str(selection["metric"])),
    ]


def config_scores(arm: dict) -> np.ndarray:
    """The tuning score of each configuration an arm tried, in index order (NaN: none)."""
    configs = sorted(arm.get("configs", []), key=lambda c: int(c["index"]))
    return np.array([_number(c.get("score")) for c in configs], dtype=float)


def selected_rows(selection: dict) -> list[dict]:
    """Section `tuning_selected`: per arm, the chosen configuration, its score and the budget."""
    rows = []
    for name in sorted(selection["arms"]):
        arm = selection["arms"][name]
        index = int(arm["selected"])
        chosen = next((c for c in arm.get("configs", []) if int(c["index"]) == index), {})
        n_seeds = int(chosen["n_seeds"]) if "n_seeds" in chosen else None
        scores = config_scores(arm)
        failed = int((~np.isfinite(scores)).sum())
        budget_note = f"{failed} failed on every tuning seed (no score)" if failed else ""
        settings = settings_text(arm.get("settings", chosen.get("settings", {})))
        rows += [
            row("tuning_selected", "selected_config", index, arm=name, note=settings),
            row("tuning_selected", "tuning_score", _number(arm["score"]), arm=name, n=n_seeds),
            row(
                "tuning_selected", "budget", len(scores), arm=name, n=len(scores), note=budget_note
            ),
        ]
    return rows


def evp_curves(selection: dict) -> dict[str, ExpectedMaxCurve]:
    """The unbiased expected-max curve of every arm with at least one scored configuration."""
    curves = {}
    for name in sorted(selection["arms"]):
        scores = config_scores(selection["arms"][name])
        scores = scores[np.isfinite(scores)]
        if len(scores):
            curves[name] = expected_max_curve(scores, estimator=ESTIMATOR)
    return curves


def evp_rows(curves: dict[str, ExpectedMaxCurve]) -> list[dict]:
    """Section `tuning_evp`: expected max and its std at budgets 1..N per arm."""
    rows = []
    for name, curve in curves.items():
        n = curve.n_configurations
        for budget, mean, std in zip(curve.budgets, curve.mean, curve.std, strict=True):
            keys = {"arm": name, "comparison": f"budget {int(budget)}", "n": n}
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
        keys = {"comparison": f"budget {budget}", "n": len(curves), "note": note}
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


def selected_seed_se(selection: dict, path: Path) -> float:
    """The largest standard error (sample SD / sqrt(n) over tuning seeds) of the selected
    configurations' tuning scores; NaN without the scores file or with fewer than 2 seeds."""
    if not path.exists():
        return math.nan
    trials = pd.read_parquet(path)
    errors = []
    for arm, entry in selection["arms"].items():
        mine = trials[(trials["arm"] == arm) & (trials["config"] == entry["selected"])]
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


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """Every tuning row; nothing when the experiment had no tuning stage."""
    paths = tuning_paths(inputs.experiment_dir)
    if paths is None:
        return Part()
    selection_path, scores_path = paths
    selection = read_selection(selection_path)
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


def _rows(summary: pd.DataFrame, section: str, statistic: str) -> pd.DataFrame:
    return summary[(summary["section"] == section) & (summary["statistic"] == statistic)]


def _protocol(summary: pd.DataFrame) -> dict[str, pd.Series]:
    part = summary[summary["section"] == "tuning_protocol"]
    return {r["statistic"]: r for _, r in part.iterrows()}


def protocol_text(summary: pd.DataFrame) -> str:
    """The paragraph that states the tuning protocol, from the `tuning_protocol` rows."""
    p = _protocol(summary)
    budget = int(p["budget"]["value"])
    metric = str(p["selection_metric"]["note"])
    metric_text = METRIC_TEXT.get(metric, "")
    metric_text = f"`{metric}`" + (f", {metric_text}" if metric_text else "")
    tuning, evaluation = p["tuning_seeds"]["note"], p["evaluation_seeds"]["note"]
    shared = set(tuning.split(", ")) & set(evaluation.split(", ")) - {""}
    fresh = "fresh " if not shared else ""
    overlap = f"; {len(shared)} of them also tuning seeds" if shared else ""
    return (
        f"Every arm tried the same budget of B = {budget} configurations of its search space, "
        f"each trained on the tuning seeds ({tuning}) and scored on the validation set "
        f"({p['validation_size']['note']}, offset {int(p['validation_offset']['value'])}, "
        f"{int(p['validation_size']['value'])} examples) by the selection metric "
        f"({metric_text}); a configuration's tuning score is the mean over the tuning seeds "
        "whose trial finished. Each arm's best configuration was selected. Its tuning score won "
        "a maximum over B noisy scores, so it is optimistic: the final comparison below runs "
        f"the selected configurations on {fresh}evaluation seeds ({evaluation}{overlap}) and "
        "scores them on the test set."
    )


def selected_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Arm, configuration index, settings, tuning score, seeds and budget, one row per arm."""
    part = summary[summary["section"] == "tuning_selected"]
    out = []
    for arm, group in part.groupby("arm", sort=True):
        by_stat = group.set_index("statistic")
        score = by_stat.loc["tuning_score"]
        budget = by_stat.loc["budget"]
        out.append(
            {
                "arm": str(arm),
                "configuration": str(int(by_stat.loc["selected_config", "value"])),
                "settings": by_stat.loc["selected_config", "note"],
                "tuning score": format_number(score["value"]),
                "seeds": "—" if pd.isna(score["n"]) else str(int(score["n"])),
                "budget": str(int(budget["value"])),
                "note": budget["note"],
            }
        )
    return pd.DataFrame(out)


def evp_text(summary: pd.DataFrame) -> str:
    """The leader at budget 1 and at the largest budget, and the winner-change sentence."""
    leaders = _rows(summary, "tuning_ranking", "leader")
    if leaders.empty:
        return ""
    change = _rows(summary, "tuning_ranking", "winner_changes").iloc[0]

    def lead(r: pd.Series) -> str:
        budget = str(r["comparison"]).removeprefix("budget ")
        value = format_number(r["value"])
        if pd.notna(r["arm"]):
            return f"at budget {budget} {r['arm']} leads with {value}"
        tied = str(r["note"]).removeprefix("tie: ")
        return f"at budget {budget} the arms {tied} tie at {value}"

    first, last = leaders.iloc[0], leaders.iloc[-1]
    opening = (
        f"Expected best validation score after n configurations drawn at random: {lead(first)}"
    )
    if last["comparison"] != first["comparison"]:
        opening += f"; {lead(last)}"
    return f"{opening}. {change['note']}{_margin_caveat(summary)}"


def _margin_caveat(summary: pd.DataFrame) -> str:
    """A sentence naming the budgets whose lead is smaller than the seed noise of the selected
    configurations' scores: the curves are point estimates, and such a lead is not a ranking."""
    margins = _rows(summary, "tuning_ranking", "margin")
    noise = _rows(summary, "tuning_ranking", "seed_se")
    if margins.empty or noise.empty or not np.isfinite(noise["value"].iloc[0]):
        return ""
    se = float(noise["value"].iloc[0])
    small = margins[margins["value"].to_numpy(dtype=float) < se]
    if small.empty:
        return (
            f" At every budget the lead exceeds the selected configurations' standard error "
            f"over tuning seeds ({format_number(se)})."
        )
    budgets = ", ".join(str(c).removeprefix("budget ") for c in small["comparison"])
    return (
        f" The lead at budget {budgets} is smaller than the selected configurations' standard "
        f"error over tuning seeds ({format_number(se)}): the order of the arms there is not "
        "established."
    )


def sensitivity_block_table(summary: pd.DataFrame) -> pd.DataFrame:
    """`wide_table` of `tuning_sensitivity`, rows in the summary's order (values ascending)."""
    table = wide_table(summary, "tuning_sensitivity")
    if table.empty:
        return table
    part = summary[summary["section"] == "tuning_sensitivity"]
    order = list(dict.fromkeys(zip(part["arm"].astype(str), part["comparison"], strict=True)))
    table = table.set_index(["arm", "comparison"]).loc[order].reset_index()
    return table.rename(columns={"comparison": "hyperparameter = value"})


def blocks(page: Page) -> list[Block]:
    """Protocol, selected configurations, EVP curves and sensitivity; nothing without tuning."""
    summary, figs = page.summary, page.figures
    if not page.has("tuning_protocol"):
        return []
    out = [
        Block("h2", "Tuning"),
        Block("p", protocol_text(summary)),
        Block("h3", "Selected configurations"),
        Block(
            "p",
            "Per arm: the index and settings of the configuration with the best tuning score, "
            "that score (the mean over its tuning seeds; seeds = how many counted) and the "
            "configurations tried.",
        ),
        Block("table", table=selected_table(summary)),
        Block("h3", "Expected validation performance"),
        *figure(
            figs,
            "tuning_evp",
            "Expected best validation score after n configurations tried, per arm (unbiased "
            "estimator over the configurations' tuning scores; band +-1 std of the best score).",
        ),
    ]
    text = evp_text(summary)
    out += [Block("p", text)] if text else []
    if page.has("tuning_sensitivity"):
        confidence = page.config.confidence
        out += [
            Block("h3", "Hyperparameter sensitivity"),
            *figure(
                figs,
                "tuning_sensitivity",
                f"Mean tuning score at each hyperparameter value, {confidence:.0%} bootstrap "
                "interval over tuning seeds.",
            ),
            Block(
                "p",
                "Mean validation score of the finished tuning trials at each value of each "
                "hyperparameter (averaged within a tuning seed first, then across seeds), with "
                f"a {confidence:.0%} percentile bootstrap interval over seeds; n = seeds.",
            ),
            Block("table", table=sensitivity_block_table(summary)),
        ]
    return [*out, Block("h3", "Tuning methods"), Block("list", items=TUNING_METHODS)]
