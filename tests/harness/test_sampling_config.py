"""Sampling settings: validated where the config is read, and handed to the learner (issue 13).

The learner reproduces temperature, top-k and top-p (`learner.algorithms.sampling_dist`); any other
option that changes the sampled distribution is refused by name, and temperatures vLLM would
silently change are refused too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.layout import TrialPaths
from contract.trial import TrialSpec
from harness.config import ConfigError, GenerationConfig, validate_config
from harness.trial.learner_main import learner_task
from learner.algorithms.sampling_dist import SamplingSettings
from tests.tiny_models import CHAR_DENSE, save_tiny_model_dir


def config_data(model_dir: Path | str = "builtin", **generation: object) -> dict[str, object]:
    return {
        "arms": [{"name": "grpo", "objective": "grpo"}],
        "model": {"path": str(model_dir)},
        "generation": {"backend": "torch", **generation},
    }


def test_learner_task_carries_the_generation_sampling(tmp_path: Path) -> None:
    model_dir = save_tiny_model_dir(tmp_path / "model", CHAR_DENSE)
    cfg = validate_config(config_data(model_dir, temperature=0.7, top_p=0.9, top_k=5))
    spec = TrialSpec(arm="grpo", seed=0, lag=0, mode="fixed")
    task = learner_task(cfg, spec, TrialPaths(tmp_path / "trial"), steps=1)
    assert task.sampling == SamplingSettings(temperature=0.7, top_p=0.9, top_k=5)
    assert cfg.generation.sampling() == task.sampling  # the generators' settings, same object


@pytest.mark.parametrize(
    "option", ["min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"]
)
def test_options_the_learner_cannot_reproduce_are_refused_by_name(option: str) -> None:
    with pytest.raises(ConfigError, match=rf"generation\.{option} is not supported"):
        validate_config(config_data(**{option: 0.1}))


def test_unknown_generation_fields_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"generation\.typo_p"):
        validate_config(config_data(typo_p=0.5))


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 0.005), ("temperature", 2.5), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1)],
)
def test_out_of_range_sampling_is_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"generation\.{field}"):
        validate_config(config_data(**{field: value}))


def test_defaults_are_the_plain_softmax() -> None:
    assert GenerationConfig().sampling() == SamplingSettings(1.0, 1.0, 0)
    assert not GenerationConfig().sampling().truncates
