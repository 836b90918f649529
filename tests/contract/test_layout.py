"""The trial and experiment directory layout: every path spelled out by hand, once."""

from __future__ import annotations

from pathlib import Path

from contract.layout import ExperimentPaths, TrialPaths


def test_trial_paths_are_the_documented_names() -> None:
    paths = TrialPaths(Path("/runs/exp/trials/gspo__seed0__lag0__fixed"))
    root = Path("/runs/exp/trials/gspo__seed0__lag0__fixed")
    assert paths.metadata == root / "trial.json"
    assert paths.trial_log == root / "trial.log"
    assert paths.resolved_config == root / "resolved_config.yaml"
    assert paths.prompts == root / "prompts.parquet"
    assert paths.metrics == root / "metrics.parquet"
    assert paths.rollouts == root / "rollouts.parquet"
    assert paths.trained_groups == root / "trained_groups"
    assert paths.checkpoints == root / "checkpoints"
    assert paths.weights == root / "weights"
    assert paths.redis_dir == root / "redis"
    assert paths.logs == root / "logs"
    assert paths.component_log("generator-1") == root / "logs" / "generator-1.log"
    assert paths.learner_outcome == root / "learner_outcome.json"


def test_experiment_paths_nest_trials_under_trials_dir() -> None:
    experiment = ExperimentPaths(Path("/runs/exp"))
    assert experiment.trials == Path("/runs/exp/trials")
    assert experiment.resolved_config == Path("/runs/exp/resolved_config.yaml")
    trial = experiment.trial("grpo__seed2__lag1__bounded")
    assert trial == TrialPaths(Path("/runs/exp/trials/grpo__seed2__lag1__bounded"))
    assert trial.metrics == Path("/runs/exp/trials/grpo__seed2__lag1__bounded/metrics.parquet")


def test_paths_are_values() -> None:
    # frozen dataclasses: equal roots are equal layouts, usable as dict keys
    assert TrialPaths(Path("a")) == TrialPaths(Path("a"))
    assert len({TrialPaths(Path("a")), TrialPaths(Path("a")), TrialPaths(Path("b"))}) == 2
