"""Section "What to do next": the seeds each comparison needs for the target power, and the
command that extends the experiment to them.

`harness run` skips every trial whose trial.json says it finished and starts only the missing
ones, and the config hash it compares leaves `seeds` out, so re-running the experiment's own
resolved config into the same output directory with a longer `seeds` list runs exactly the new
seeds' trials (every arm and lag of them: seeds are shared, which keeps the comparison matched).
The command names `<dir>/resolved_config.yaml`, which every launch writes, so it needs neither
the original config file nor its overrides; `--steps` is added when the trials ran under a
`--steps` cap different from the config's `learner.steps`. Seeds are written compactly, runs of
consecutive seeds as `range(a,b)` (a to b - 1, as in Python), which the config's `seeds` field
reads alone (`seeds=range(0,12)`) or as list items (`seeds=[3,"range(5,12)"]`). A comparison
that would need more than `MAX_PRACTICAL_SEEDS` seeds gets advice instead of a command.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from analysis.render import Block
from analysis.sections.base import Inputs, Page, Part, no_figures, table
from analysis.stats.power import MAX_PRACTICAL_SEEDS
from analysis.summary import row
from contract.layout import RESOLVED_CONFIG

PLACEHOLDER_CONFIG = "CONFIG.yaml"
METHODS: list[str] = []
draw = no_figures


@dataclass(frozen=True)
class LaunchFacts:
    """What the extension command needs from the experiment directory."""

    experiment_dir: Path
    config_path: str  # the resolved config, or a placeholder when it is not on disk
    seeds: tuple[int, ...]  # seeds of the experiment so far
    steps_flag: int | None  # `--steps` to repeat, None when the config's learner.steps holds


def _read_resolved(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def launch_facts(experiment_dir: Path, trials: pd.DataFrame) -> LaunchFacts:
    """Seeds, config path and step cap of the experiment in `experiment_dir`."""
    resolved = Path(experiment_dir) / RESOLVED_CONFIG
    data = _read_resolved(resolved)
    seeds = {int(s) for s in data.get("seeds", [])}
    if len(trials):
        seeds |= {int(s) for s in trials["seed"].dropna()}
    planned = trials["steps_planned"].dropna() if len(trials) else pd.Series(dtype=float)
    config_steps = (data.get("learner") or {}).get("steps")
    steps_flag = None
    if planned.nunique() == 1 and int(planned.iloc[0]) != config_steps:
        steps_flag = int(planned.iloc[0])
    config_path = str(resolved) if data else PLACEHOLDER_CONFIG
    return LaunchFacts(Path(experiment_dir), config_path, tuple(sorted(seeds)), steps_flag)


def extended_seeds(current: tuple[int, ...], needed: int) -> list[int]:
    """The current seeds plus the smallest unused non-negative integers, `needed` in all."""
    out, candidate = list(current), 0
    while len(out) < needed:
        if candidate not in current:
            out.append(candidate)
        candidate += 1
    return sorted(out)


def _runs(seeds: list[int]) -> list[tuple[int, int]]:
    """Sorted seeds as half-open runs [a, b) of consecutive integers."""
    runs: list[tuple[int, int]] = []
    for seed in sorted(seeds):
        if runs and seed == runs[-1][1]:
            runs[-1] = (runs[-1][0], seed + 1)
        else:
            runs.append((seed, seed + 1))
    return runs


def seeds_text(seeds: list[int]) -> str:
    """The `seeds` override value, compact: `range(0,12)` for consecutive seeds, else a list
    whose runs of 3 or more are `"range(a,b)"` items (`[0,2,"range(5,9)"]`)."""
    runs = _runs(seeds)
    if len(runs) == 1 and runs[0][1] - runs[0][0] > 1:
        return f"range({runs[0][0]},{runs[0][1]})"
    items: list[str] = []
    for a, b in runs:
        items += [f'"range({a},{b})"'] if b - a >= 3 else [str(s) for s in range(a, b)]
    return f"[{','.join(items)}]"


def extension_command(facts: LaunchFacts, needed: int) -> str:
    """`harness run <resolved config> --out <dir> [--steps N] 'seeds=range(0,N)'` as a shell
    line (seeds as `seeds_text` writes them)."""
    seeds = seeds_text(extended_seeds(facts.seeds, needed))
    args = ["harness", "run", facts.config_path, "--out", str(facts.experiment_dir)]
    if facts.steps_flag is not None:
        args += ["--steps", str(facts.steps_flag)]
    return shlex.join([*args, f"seeds={seeds}"])


def _advice(facts: LaunchFacts, needed: float, reason: str) -> str:
    have = len(facts.seeds)
    if math.isnan(needed):
        return f"no seed count reaches the target power ({reason or 'no effect'})"
    if needed <= have:
        return f"the {have} seeds run are enough at the observed effect"
    if needed > MAX_PRACTICAL_SEEDS:
        return (
            f"about {int(needed):,} seeds per arm: the observed effect is impractically small to "
            f"resolve with seeds (more than {MAX_PRACTICAL_SEEDS}); make the effect bigger or "
            "the scores less noisy instead (longer runs, a larger eval set)"
        )
    extra = ""
    if facts.config_path == PLACEHOLDER_CONFIG:
        extra = f" ({RESOLVED_CONFIG} not found: replace {PLACEHOLDER_CONFIG} with the config)"
    return f"run: {extension_command(facts, int(needed))}{extra}"


def next_step_rows(summary: pd.DataFrame, facts: LaunchFacts) -> list[dict]:
    """Section `next_steps`: per comparison, seeds needed vs run, and the command to get there.

    The last row ('every comparison') extends to the largest need of at most
    `MAX_PRACTICAL_SEEDS`, which powers every comparison that seeds can resolve at all.
    """
    power = summary[(summary["section"] == "power") & (summary["statistic"] == "seeds_needed")]
    rows, have = [], len(facts.seeds)
    for r in power.sort_values(["lag", "comparison"]).itertuples(index=False):
        needed = float(r.value)
        common = {"lag": None if pd.isna(r.lag) else int(r.lag), "comparison": str(r.comparison)}
        note = _advice(facts, needed, str(r.note))
        rows += [
            row("next_steps", "seeds_needed", needed, n=have, note=note, **common),
            row("next_steps", "seeds_run", float(have), **common),
        ]
    finite = [v for v in power["value"] if math.isfinite(v)]
    practical = [v for v in finite if v <= MAX_PRACTICAL_SEEDS]
    if finite:
        needed = max(practical or finite)
        common = {"comparison": "every comparison"}
        note = _advice(facts, needed, "")
        if practical and len(practical) < len(finite):
            note += f" (comparisons needing more than {MAX_PRACTICAL_SEEDS} seeds left out)"
        rows += [
            row("next_steps", "seeds_needed", needed, n=have, note=note, **common),
            row("next_steps", "seeds_run", float(have), **common),
        ]
    return rows


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """Section `next_steps`, from the Power rows of `prior`; nothing without an experiment dir."""
    if inputs.experiment_dir is None or inputs.scored.empty:
        return Part()
    facts = launch_facts(inputs.experiment_dir, inputs.experiment.trials)
    return Part(next_step_rows(prior, facts))


def blocks(page: Page) -> list[Block]:
    """What to do next: seeds for the target power and the command that adds them."""
    if not page.any_scored or not page.has("next_steps"):
        return []
    return [
        Block("h2", "What to do next"),
        *table(
            page.summary,
            "next_steps",
            "Seeds for the target power",
            "Seeds per arm the observed effect on the final score needs for the target power "
            "(see Power), the seeds run so far, and the command that adds the missing seeds "
            "(`range(a,b)` = seeds a to b - 1): `harness run` skips every finished trial and "
            "runs only the new seeds' trials (all arms and lags, so the comparison stays "
            f"matched). Past {MAX_PRACTICAL_SEEDS} seeds no command is given: seeds cannot "
            "resolve so small an effect in practice. Effects from few seeds are noisy; treat "
            "the count as a plan, not a promise.",
        ),
    ]
