"""Eval sets, pass@k settings and the training mixture in the config: defaults and errors that
name the field."""

from __future__ import annotations

from typing import Any

import pytest

from harness.config import ConfigError, TaskConfig, validate_config

ARMS = [{"name": "grpo", "objective": "grpo"}]


def config(**fields: Any):
    return validate_config({"arms": ARMS, **fields})


def error(**fields: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        config(**fields)
    return str(caught.value)


def test_defaults_keep_the_single_heldout_set_and_the_task_stream() -> None:
    cfg = config(task={"name": "addition", "digits": 3, "eval_size": 16})
    assert cfg.eval_sets() == [("heldout", cfg.task)]
    assert cfg.train_components() == [("addition", 1.0, cfg.task)]
    assert (cfg.eval.samples, cfg.eval.pass_k) == (0, [])


def test_eval_sets_resolve_in_order_and_default_to_the_task() -> None:
    cfg = config(
        evals=[{"name": "in_dist"}, {"name": "hard3", "task": {"name": "addition", "digits": 3}}],
        eval={"samples": 4, "pass_k": [1, 4]},
    )
    (first, first_task), (second, second_task) = cfg.eval_sets()
    assert (first, first_task) == ("in_dist", cfg.task)
    assert (second, second_task) == ("hard3", TaskConfig(name="addition", digits=3))


@pytest.mark.parametrize("bad", ["Hard", "has-dash", "", "a b"])
def test_bad_eval_set_names_are_named(bad: str) -> None:
    message = error(evals=[{"name": "ok"}, {"name": bad}])
    assert "evals.1.name" in message and "pattern" in message


def test_duplicate_eval_set_names_are_named() -> None:
    message = error(evals=[{"name": "a"}, {"name": "b"}, {"name": "a"}])
    assert "evals.2.name='a' repeats evals.0.name" in message


def test_pass_k_above_samples_is_refused_naming_both_fields() -> None:
    message = error(eval={"samples": 4, "pass_k": [1, 8]})
    assert "eval.pass_k=[1, 8]: k=8 is outside [1, eval.samples=4]" in message
    assert "eval.pass_k" in error(eval={"samples": 0, "pass_k": [1]})
    assert "duplicates" in error(eval={"samples": 4, "pass_k": [2, 2]})
    assert "eval.samples" in error(eval={"samples": -1})


@pytest.mark.parametrize("weight", [0, -0.5])
def test_mixture_weights_must_be_positive(weight: float) -> None:
    message = error(
        train_tasks=[
            {"weight": 1, "task": {"name": "addition"}},
            {"weight": weight, "task": {"name": "multiplication"}},
        ]
    )
    assert "train_tasks.1.weight" in message and "greater than 0" in message


def test_mixture_names_default_to_the_task_name_and_must_be_unique() -> None:
    cfg = config(
        train_tasks=[
            {"weight": 3, "task": {"name": "addition"}},
            {"name": "add3", "weight": 1, "task": {"name": "addition", "digits": 3}},
        ]
    )
    assert [(name, weight) for name, weight, _ in cfg.train_components()] == [
        ("addition", 3.0),
        ("add3", 1.0),
    ]
    message = error(
        train_tasks=[
            {"weight": 1, "task": {"name": "addition"}},
            {"weight": 1, "task": {"name": "addition", "digits": 3}},
        ]
    )
    assert "train_tasks.1.name='addition' repeats train_tasks.0.name" in message
    assert "default: task.name; set name" in message
    assert "train_tasks.0.weight" in error(train_tasks=[{"task": {"name": "addition"}}])
