"""Session fixtures of the harness tests: finished trials shared by the tests that read them
(tests/harness/shared_trials.py says which, and how a test that changes one copies it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.shared_trials import (
    GRPO_LAG1,
    GRPO_TWO_STEPS,
    GSPO_TWO_SEEDS,
    VLLM_ARMS,
    VLLM_GRPO_LAG1,
    SharedTrials,
)


@pytest.fixture(scope="session")
def shared_trials(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedTrials]:
    # pytest-xdist: every worker's base temp dir sits in one folder of the run; share it.
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    trials = SharedTrials(shared / "shared_trials")
    yield trials
    changed = trials.changed()
    assert not changed, f"tests wrote to shared trials {changed}: take a private_copy instead"


@pytest.fixture(scope="session")
def grpo_two_steps(shared_trials: SharedTrials) -> Path:
    """GRPO, 2 steps at lag 0, primary greedy eval only; read-only (copy it to change it)."""
    return shared_trials.trial(GRPO_TWO_STEPS)


@pytest.fixture(scope="session")
def grpo_lag1(shared_trials: SharedTrials) -> Path:
    """GRPO at fixed lag 1, 14 uninterrupted steps; read-only (copy it to change it)."""
    return shared_trials.trial(GRPO_LAG1)


@pytest.fixture(scope="session")
def gspo_two_seeds(shared_trials: SharedTrials) -> Path:
    """`harness run` output: GSPO at lag 0, seeds 0 and 1, 4 steps; read-only."""
    return shared_trials.experiment(GSPO_TWO_SEEDS)


@pytest.fixture(scope="session")
def vllm_arms(shared_trials: SharedTrials) -> Path:
    """`harness run` output: the four objectives at lags 0 and 1 on vLLM, 2 steps each, in one
    slot of warm component processes (one vLLM engine for all eight); read-only."""
    return shared_trials.experiment(VLLM_ARMS)


@pytest.fixture(scope="session")
def vllm_grpo_lag1(shared_trials: SharedTrials) -> Path:
    """A cold `harness trial` of VLLM_ARMS' GRPO lag-1 trial (its own vLLM engine); read-only."""
    return shared_trials.trial(VLLM_GRPO_LAG1)
