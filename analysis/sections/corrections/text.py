"""The report's "Off-policy corrections and staleness" section, as render blocks.

Built from summary section `corrections` only (`tables`), like every other table. The
scores are shown as an arm x lag grid, so a correction's score reads across its row of lags; the
diagnostics as the usual one-row-per-(arm, lag) tables. Tables without rows are left out.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.render import DASH, Block, cell_text, wide_table
from analysis.sections.corrections.tables import (
    MOE_STATS,
    OFFPOLICY_STATS,
    SECTION,
    STALENESS_STATS,
)


def lag_grid(summary: pd.DataFrame, statistic: str) -> pd.DataFrame:
    """One row per arm, one column per lag: 'value [low, high]' of `statistic` in `corrections`."""
    part = summary[
        (summary["section"] == SECTION)
        & (summary["statistic"] == statistic)
        & summary["lag"].notna()
    ]
    if part.empty:
        return pd.DataFrame()
    part = part.assign(cell=part.apply(cell_text, axis=1), lag=part["lag"].astype(int))
    grid = part.pivot(index="arm", columns="lag", values="cell").sort_index()
    grid = grid.reindex(columns=sorted(grid.columns)).fillna(DASH)
    grid.columns = [f"lag {lag}" for lag in grid.columns]
    return grid.reset_index()


def _table(summary: pd.DataFrame, stats: tuple[str, ...], title: str, text: str) -> list[Block]:
    shown = set(summary.loc[summary["section"] == SECTION, "statistic"])
    table = wide_table(summary, SECTION, [s for s in stats if s in shown])
    if table.empty:
        return []
    return [Block("h3", title), Block("p", text), Block("table", table=table)]


def _grids(summary: pd.DataFrame) -> list[Block]:
    out = []
    for stat, title in (("final_score_iqm", "Final score"), ("auc_iqm", "AUC")):
        grid = lag_grid(summary, stat)
        if not grid.empty:
            out += [Block("h3", f"{title} by correction and lag"), Block("table", table=grid)]
    if out:
        text = (
            "IQM across seeds with bootstrap CI, the numbers of the Scores section arranged so "
            "that each arm (a correction) reads across its lags; seeds per cell as there."
        )
        out.insert(1, Block("p", text))
    return out


def correction_blocks(summary: pd.DataFrame, figs: dict[str, Path]) -> list[Block]:
    """The whole section; empty when the summary has no `corrections` rows."""
    if not (summary["section"] == SECTION).any():
        return []
    blocks = [Block("h2", "Off-policy corrections and staleness"), *_grids(summary)]
    if "corrections" in figs:
        blocks.append(
            Block(
                "figure",
                "Final score and AUC (IQM), ESS/N and clip fraction (mean) against lag, per arm.",
                path=figs["corrections"],
            )
        )
    blocks += _table(
        summary,
        OFFPOLICY_STATS,
        "Correction diagnostics",
        "Per trial the mean over steps, then the mean across seeds with CI; n = seeds. "
        "ess_frac: effective sample size of the correction weights over N (1 = on-policy); "
        "clip_frac: policy/clip_frac; weight_mean, masked_frac, trunc_frac: the applied weight's "
        "mean and the shares of tokens zeroed or capped (none for naive); kl_staleness: k3 "
        "KL(behaviour || learner) on rows from older versions, the staleness gap; kl_engine: "
        "the same on same-version rows, the inference-engine gap, for scale.",
    )
    blocks += _table(
        summary,
        STALENESS_STATS,
        "Staleness accounting",
        "Mean across seeds with CI; n = seeds. staleness_mean: mean version lag of trained "
        "groups; generation_s / queue_s / age_s: seconds from generation start to push, push to "
        "training, and start to training; dropped_total: groups dropped as too stale per trial; "
        "dropped_frac: their share of the groups read. bias_reward / bias_length: run mean of "
        "the trained groups minus the run mean of every group read (trained + dropped). "
        "Dropping stale groups keeps those that came back fast, the short and often easy "
        "prompts: a positive reward bias and a negative length bias mean the learner trained on "
        "an easier, shorter mix than the policy generated, so its reward curve flatters it.",
    )
    blocks += _table(
        summary,
        MOE_STATS,
        "MoE routing",
        "Mean across seeds with CI; n = seeds. routing_change_frac: share of routing decisions "
        "(a token at a layer) an update changed; token_rerouted_frac: share of tokens it "
        "re-routed in at least one layer (what moves a token's ratio); "
        "rollout_routing_mismatch and rollout_token_rerouted_frac: the same between the "
        "experts the generator recorded and the learner's own router (what R3 routing replay "
        "removes). logratio_var: variance over response tokens of the token log-ratio after "
        "the updates (routers free, against the step's pi_old); routing_logratio_var: variance "
        "of its difference from the same log-ratio on pi_old's replayed experts, the part only "
        "routing moves; routing_logratio_var_frac: that part's share of the total, clipped to "
        "[0, 1] (what routing explains of the ratio's spread, the GSPO paper's MoE argument).",
    )
    return blocks
