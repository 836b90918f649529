"""Section "Trials": counts and start-up per (arm, lag), and every diverged, incomplete or missing
trial.

Start-up (trial start to its first learner update, `analysis.wall_clock`) is left out of every
wall-clock axis, so it is shown here: a reader sees what was cut, and whether an arm starts
slower (a critic to load, a cold cache on the first trial).
"""

from __future__ import annotations

import pandas as pd

from analysis.render import Block, wide_table
from analysis.sections.base import Inputs, Page, Part, no_figures
from analysis.stats import BootstrapSpec, aggregate_interval
from analysis.summary import interval_row, row
from analysis.trial_scores import by_condition

METHODS: list[str] = []
draw = no_figures
STARTUP_TEXT = (
    "startup_s: seconds from a trial's start to its first learner update (process start, "
    "model load, initial eval, the wait for the first batch while generators start), mean "
    "across the cell's trials with CI; wall-clock axes leave it out."
)


def trial_rows(scores: pd.DataFrame) -> list[dict]:
    """Section `trials`: trials, scored, diverged and seeds per (arm, lag)."""
    rows = []
    for (arm, lag), cell in scores.groupby(["arm", "lag"], sort=True):
        keys = {"arm": str(arm), "lag": int(lag)}
        rows += [
            row("trials", "trials", len(cell), n=len(cell), **keys),
            row("trials", "scored", int(cell["scored"].sum()), n=len(cell), **keys),
            row("trials", "diverged", int(cell["diverged"].sum()), n=len(cell), **keys),
            row("trials", "seeds", cell["seed"].nunique(), n=len(cell), **keys),
        ]
        if "rewinds" in scores.columns and scores["rewinds"].gt(0).any():  # only if any was
            rewound = cell["rewinds"].gt(0)
            rows += [
                row("trials", "rewound", int(rewound.sum()), n=len(cell), **keys),
                row(
                    "trials", "groups lost to rewinds", int(cell["rewind_lost_groups"].sum()),
                    n=len(cell), **keys,
                ),
            ]  # fmt: skip
    return rows


def startup_rows(scores: pd.DataFrame, spec: BootstrapSpec) -> list[dict]:
    """Section `trials`, statistic `startup_s`: seconds from trial start to first update, mean
    across the cell's trials with CI (n = trials with a start time and a training row)."""
    if "startup_s" not in scores.columns:
        return []
    rows = []
    for (arm, lag), values in by_condition(scores, "startup_s").items():
        if len(values):
            interval = aggregate_interval(values, "mean", spec)
            rows.append(interval_row("trials", "startup_s", interval, arm=arm, lag=lag))
    return rows


def problem_rows(problems: pd.DataFrame) -> list[dict]:
    """Section `problems`: one row per listed issue (value NaN, the issue in the note)."""
    rows = []
    for p in problems.itertuples(index=False):
        lag = None if pd.isna(p.lag) else int(p.lag)
        arm = None if p.arm is None or pd.isna(p.arm) else str(p.arm)
        note = f"{p.status}: {p.problem}"
        rows.append(
            row(
                "problems",
                "problem",
                float("nan"),
                arm=arm,
                lag=lag,
                comparison=str(p.trial_name),
                note=note,
            )
        )
    return rows


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    scores = inputs.scores
    rows = trial_rows(scores) + startup_rows(scores, inputs.spec) if len(scores) else []
    return Part(rows + problem_rows(inputs.experiment.problems))


def problem_items(problems: pd.DataFrame) -> list[str]:
    """One line per problem trial: name, what is known of it, and what went wrong."""
    items = []
    for p in problems.itertuples(index=False):
        known = [
            f"{k} {v}"
            for k, v in (("arm", p.arm), ("seed", p.seed), ("lag", p.lag))
            if not pd.isna(v)
        ]
        where = f" ({', '.join(known)})" if known else ""
        items.append(f"{p.trial_name}{where}: {p.problem}")
    return items


REWOUND_TEXT = (
    "rewound: trials a bounded-mode resume rewound to an older checkpoint (the newest one or a "
    "step file it vouched for was damaged, or the learner was killed between checkpoints): "
    "versions published after it were withdrawn and training continued from it; groups lost "
    "to rewinds: groups trained after that checkpoint (lost with their steps) plus groups made "
    "from withdrawn weights (dropped); every prompt was made again (`rewind/*` metrics)."
)


def rewound_items(scores: pd.DataFrame) -> list[str]:
    """One line per rewound trial: how often, and what it cost."""
    if "rewinds" not in scores.columns:
        return []
    return [
        f"{t.trial_name}: rewound {int(t.rewinds)} time(s), {int(t.rewind_lost_groups)} "
        "group(s) lost"
        for t in scores.itertuples(index=False)
        if t.rewinds > 0
    ]


def policy_line(scores: pd.DataFrame) -> str:
    """Which staleness policy the trials ran (mode and lag, and the weight-sync interval), with
    how many trials ran each: the report states the regime of every number below."""
    if not len(scores) or "policy" not in scores.columns:
        return ""
    counts = scores["policy"].value_counts(sort=False).sort_index()
    ran = "; ".join(f"{policy} ({n} trial{'' if n == 1 else 's'})" for policy, n in counts.items())
    return f"Staleness policies: {ran}."


def blocks(page: Page) -> list[Block]:
    policy = policy_line(page.scores)
    startup = page.summary["statistic"].eq("startup_s") & page.summary["section"].eq("trials")
    rewound = rewound_items(page.scores)
    return [
        Block("h2", "Trials"),
        *([Block("p", policy)] if policy else []),
        *([Block("p", STARTUP_TEXT)] if startup.any() else []),
        Block("table", table=wide_table(page.summary, "trials")),
        *([Block("p", REWOUND_TEXT), Block("list", items=rewound)] if rewound else []),
        Block("h3", "Diverged, incomplete or missing trials"),
        Block("list", items=problem_items(page.problems)),
    ]
