"""The Tuning section's text, written from the summary frame alone (its typed columns for
numbers: `value`, `n`, `budget`, `seeds`), so what a reader sees is what summary.parquet holds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.render import Block, format_number, wide_table
from analysis.sections.base import Page, figure
from analysis.sections.tuning.rows import seeds_text

METRIC_TEXT = {
    "final": "the score at the end of training",
    "auc": "the area under the validation curve",
}
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
    tuning_seeds, evaluation_seeds = p["tuning_seeds"]["seeds"], p["evaluation_seeds"]["seeds"]
    tuning, evaluation = seeds_text(tuning_seeds), seeds_text(evaluation_seeds)
    shared = set(tuning_seeds) & set(evaluation_seeds)
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
        budget = int(r["budget"])
        value = format_number(r["value"])
        if pd.notna(r["arm"]):
            return f"at budget {budget} {r['arm']} leads with {value}"
        tied = str(r["note"]).removeprefix("tie: ")
        return f"at budget {budget} the arms {tied} tie at {value}"

    first, last = leaders.iloc[0], leaders.iloc[-1]
    opening = (
        f"Expected best validation score after n configurations drawn at random: {lead(first)}"
    )
    if last["budget"] != first["budget"]:
        opening += f"; {lead(last)}"
    return f"{opening}. {change['note']}{margin_caveat(summary)}"


def margin_caveat(summary: pd.DataFrame) -> str:
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
    budgets = ", ".join(str(int(b)) for b in small["budget"])
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


def tuning_blocks(page: Page) -> list[Block]:
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
        out += sensitivity_blocks(page)
    return [*out, Block("h3", "Tuning methods"), Block("list", items=TUNING_METHODS)]


def sensitivity_blocks(page: Page) -> list[Block]:
    """The sensitivity subsection: figure, what it shows, the table."""
    confidence = page.config.confidence
    return [
        Block("h3", "Hyperparameter sensitivity"),
        *figure(
            page.figures,
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
        Block("table", table=sensitivity_block_table(page.summary)),
    ]
