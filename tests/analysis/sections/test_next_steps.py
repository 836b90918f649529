"""'What to do next': the seeds-extension command parses with the real CLI, and re-running it
runs only the missing trials (the grid classification `harness run` uses, on a real directory)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pandas as pd
import pytest
import typer.main
import yaml

from analysis.sections.next_steps import (
    PLACEHOLDER_CONFIG,
    LaunchFacts,
    extended_seeds,
    extension_command,
    launch_facts,
    next_step_rows,
    seeds_text,
)
from analysis.summary import row, to_frame
from contract.layout import ExperimentPaths
from harness.cli import app
from harness.config import load_config
from harness.experiment.grid import classify_trials, expand_trials

REPO = Path(__file__).resolve().parents[3]


def _parse_run(command: str) -> dict:
    """The params `harness run` would receive, parsed by the real typer/click command."""
    args = shlex.split(command)
    assert args[:2] == ["harness", "run"]
    group = typer.main.get_command(app)
    parent = group.make_context("harness", args[1:])
    run = group.get_command(parent, "run")
    return run.make_context("run", args[2:], parent=parent).params


def _finished_experiment(root: Path, steps: int | None = None) -> pd.DataFrame:
    """The quickstart's arms on seeds 0-2 x lags {0, 2}, on disk as `harness run` leaves it:
    resolved config and a completed trial.json per trial with the hash the trial recorded;
    returns the trials table."""
    cfg = load_config(REPO / "configs/quickstart.yaml", ["seeds=[0,1,2]", "staleness.lags=[0,2]"])
    root.mkdir(parents=True)
    ExperimentPaths(root).resolved_config.write_text(
        yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    )
    rows = []
    for spec in expand_trials(cfg, root):
        spec.trial_dir.mkdir(parents=True)
        record = {"arm": spec.arm, "seed": spec.seed, "lag": spec.lag, "mode": spec.mode}
        planned = steps if steps is not None else cfg.learner.steps
        record |= {
            "status": "completed",
            "config_hash": cfg.config_hash(),
            "steps_planned": planned,
        }
        spec.paths.metadata.write_text(json.dumps(record))
        rows.append({"seed": spec.seed, "steps_planned": planned})
    return pd.DataFrame(rows)


def test_extended_seeds_fill_the_smallest_unused() -> None:
    assert extended_seeds((0, 1, 2), 5) == [0, 1, 2, 3, 4]
    assert extended_seeds((0, 2, 5), 5) == [0, 1, 2, 3, 5]
    assert extended_seeds((0, 1, 2), 2) == [0, 1, 2]  # never drops a seed


@pytest.mark.parametrize("steps", [None, 4])
def test_extension_command_runs_only_the_missing_trials(tmp_path: Path, steps: int | None) -> None:
    root = tmp_path / "exp"
    trials = _finished_experiment(root, steps)
    facts = launch_facts(root, trials)
    assert facts.seeds == (0, 1, 2) and facts.steps_flag == steps
    command = extension_command(facts, 5)
    params = _parse_run(command)
    assert Path(params["out"]) == root and params["steps"] == steps
    assert params["config"] == ExperimentPaths(root).resolved_config
    cfg = load_config(params["config"], params["overrides"])
    assert cfg.seeds == [0, 1, 2, 3, 4]
    # What `harness run` does first: classify every grid trial from its directory.
    per_trial = steps if steps is not None else cfg.learner.steps
    states = classify_trials(expand_trials(cfg, Path(params["out"])), cfg.config_hash(), per_trial)
    done = {(t.spec.seed, t.spec.arm, t.spec.lag) for t in states if t.state == "done"}
    pending = {(t.spec.seed, t.spec.arm, t.spec.lag) for t in states if t.state == "pending"}
    arms, lags = [a.name for a in cfg.arms], cfg.staleness.lags
    assert done == {(s, a, lag) for s in (0, 1, 2) for a in arms for lag in lags}
    assert pending == {(s, a, lag) for s in (3, 4) for a in arms for lag in lags}
    # The finished trials are comparable: no "ran with another config hash" warning.
    assert [t.problem for t in states] == [None] * len(states)


def _next_steps_after(tmp_path: Path, power: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A finished 3-seed experiment's next-step rows from `power`: (all, seeds_needed by key)."""
    root = tmp_path / "exp"
    facts = launch_facts(root, _finished_experiment(root))
    out = to_frame(next_step_rows(to_frame(power), facts))
    return out, out[out["statistic"] == "seeds_needed"].set_index(["comparison", "lag"])


def test_next_step_rows_from_the_power_table(tmp_path: Path) -> None:
    power = [
        row("power", "seeds_needed", 6.0, lag=0, comparison="grpo vs gspo"),
        row("power", "seeds_needed", 2.0, lag=2, comparison="grpo vs gspo"),
        row("power", "seeds_needed", float("nan"), lag=2, comparison="gspo vs ppo", note="d: x"),
    ]
    out, needed = _next_steps_after(tmp_path, power)
    lag0 = needed.loc[("grpo vs gspo", 0)]
    assert lag0["value"] == 6 and lag0["n"] == 3
    assert _parse_run(lag0["note"].removeprefix("run: "))["overrides"] == ["seeds=range(0,6)"]
    assert (
        needed.loc[("grpo vs gspo", 2)]["note"]
        == "the 3 seeds run are enough at the observed effect"
    )
    assert needed.loc[("gspo vs ppo", 2)]["note"] == "no seed count reaches the target power (d: x)"
    every = out[out["comparison"] == "every comparison"].set_index("statistic")
    assert every.loc["seeds_needed", "value"] == 6  # the largest finite need
    assert every.loc["seeds_run", "value"] == 3


def test_without_resolved_config_the_command_names_a_placeholder(tmp_path: Path) -> None:
    trials = pd.DataFrame({"seed": [0, 1], "steps_planned": [10, 10]})
    facts = launch_facts(tmp_path, trials)
    assert facts.config_path == PLACEHOLDER_CONFIG and facts.steps_flag == 10
    params = _parse_run(extension_command(facts, 3))
    assert params["overrides"] == ["seeds=range(0,3)"] and params["steps"] == 10


def test_seeds_are_written_compactly() -> None:
    assert seeds_text(list(range(216))) == "range(0,216)"
    assert seeds_text([0, 1]) == "range(0,2)"
    assert seeds_text([5]) == "[5]"
    # Runs of 3 or more become quoted range items; shorter runs stay integers.
    assert seeds_text([0, 2, 5, 6, 7, 8, 11, 12]) == '[0,2,"range(5,9)",11,12]'


@pytest.mark.parametrize(
    ("current", "needed", "expected"),
    [
        ((0, 1, 2), 12, list(range(12))),
        ((0, 1, 2), 50, list(range(50))),
        ((42, 43), 12, [*range(10), 42, 43]),  # kept seeds outside the new run
    ],
)
def test_the_printed_seeds_parse_through_the_real_config_loader(
    current: tuple[int, ...], needed: int, expected: list[int]
) -> None:
    facts = LaunchFacts(Path("runs/x"), str(REPO / "configs/quickstart.yaml"), current, None)
    command = extension_command(facts, needed)
    assert len(command) < 120  # never a list of every seed
    params = _parse_run(command)
    assert load_config(params["config"], params["overrides"]).seeds == expected


def test_more_than_fifty_seeds_get_advice_instead_of_a_command(tmp_path: Path) -> None:
    power = [
        row("power", "seeds_needed", 216.0, lag=0, comparison="grpo vs gspo"),
        row("power", "seeds_needed", 12.0, lag=2, comparison="grpo vs gspo"),
    ]
    out, needed = _next_steps_after(tmp_path, power)
    note = needed.loc[("grpo vs gspo", 0)]["note"]
    assert "run:" not in note and "harness" not in note
    assert note.startswith("about 216 seeds per arm: the observed effect is impractically small")
    assert "longer runs, a larger eval set" in note
    # 'every comparison' powers the comparisons seeds can resolve, and says which it leaves out.
    every = out[(out["comparison"] == "every comparison") & (out["statistic"] == "seeds_needed")]
    assert every["value"].item() == 12
    assert "'seeds=range(0,12)'" in every["note"].item()
    assert every["note"].item().endswith("(comparisons needing more than 50 seeds left out)")
