"""The training mixture: a deterministic stream matched across arms, its weights honoured, and
every prompt scored by the verifier of the task it came from (real generator, real tiny model)."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from contract.trial import TrialSpec
from harness.config import ExperimentConfig, validate_config
from harness.models.tokenizer import build_char_tokenizer
from harness.tasks.factory import make_rendered_task
from harness.tasks.mixture import make_train_mixture
from harness.trial.prepare import prompt_table
from harness.trial.rollout_groups import GeneratorStats, GroupMaker
from tests.tiny_models import save_tiny_model_dir

TOKENIZER = build_char_tokenizer(model_max_length=64)


def config(model_dir: Path | None = None, **fields: Any) -> ExperimentConfig:
    data: dict[str, Any] = {"arms": [{"name": "grpo", "objective": "grpo"}], **fields}
    if model_dir is not None:
        data["model"] = {"path": str(model_dir)}
        data["generation"] = {"backend": "torch", "group_size": 2, "max_new_tokens": 4}
        data["learner"] = {"prompts_per_step": 4}
    return validate_config(data)


def three_way(**extra: Any) -> list[dict[str, Any]]:
    return [
        {"name": "add2", "weight": 7, "task": {"name": "addition", "digits": 2, **extra}},
        {"name": "add3", "weight": 2, "task": {"name": "addition", "digits": 3, **extra}},
        {"name": "mul1", "weight": 1, "task": {"name": "multiplication", "digits": 1, **extra}},
    ]


def test_without_train_tasks_the_stream_is_the_task_stream() -> None:
    cfg = config(task={"name": "addition", "digits": 2})
    mixture = make_train_mixture(cfg, TOKENIZER)
    task = make_rendered_task(cfg.task, TOKENIZER)
    for seed in (0, 3):
        for index in range(200):
            component, prompt = mixture.prompt(seed, index)
            assert component.name == "addition"
            assert prompt == task.train_prompt(seed, index)


def test_the_stream_is_a_pure_function_of_seed_and_index() -> None:
    cfg = config(train_tasks=three_way())
    forward = [make_train_mixture(cfg, TOKENIZER).prompt(5, i) for i in range(300)]
    fresh = make_train_mixture(cfg, TOKENIZER)
    backward = [fresh.prompt(5, i) for i in reversed(range(300))][::-1]  # any order, any process
    assert [(c.name, p) for c, p in forward] == [(c.name, p) for c, p in backward]
    other_seed = [make_train_mixture(cfg, TOKENIZER).component_index(6, i) for i in range(300)]
    assert other_seed != [fresh.component_index(5, i) for i in range(300)]
    # Each prompt is its component's own training prompt of that index.
    tasks = {name: make_rendered_task(t, TOKENIZER) for name, _, t in cfg.train_components()}
    for index, (component, prompt) in enumerate(forward):
        assert prompt == tasks[component.name].train_prompt(5, index)


def test_weights_are_honoured() -> None:
    mixture = make_train_mixture(config(train_tasks=three_way()), TOKENIZER)
    n = 20_000
    counts = Counter(mixture.component_index(0, i) for i in range(n))
    # Each count is Binomial(n, p) with p = weight / 10: sd = sqrt(n p (1 - p)) = 64.8 (p=0.7),
    # 56.6 (p=0.2), 42.4 (p=0.1); a fixed seed makes the test deterministic, 5 sd is the bound.
    for index, share in enumerate((0.7, 0.2, 0.1)):
        bound = 5 * math.sqrt(n * share * (1 - share))
        assert abs(counts[index] - n * share) < bound, (index, counts)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model_dir(tmp_path_factory.mktemp("mixture") / "model")


def test_prompt_table_is_matched_across_arms_and_names_each_rows_task(model_dir: Path) -> None:
    cfg = config(
        model_dir,
        train_tasks=three_way(),
        evals=[{"name": "main"}, {"name": "hard", "task": {"name": "addition", "digits": 3}}],
    )
    tables = [prompt_table(cfg, TrialSpec(arm, 0, 1, "fixed"), 10, model_dir) for arm in "ab"]
    assert tables[0].equals(tables[1])
    table = tables[0]
    train = table[table["split"] == "train"]
    mixture = make_train_mixture(cfg, TOKENIZER)
    expected = [mixture.components[mixture.component_index(0, i)].name for i in range(40)]
    assert train["task"].tolist() == expected
    assert set(expected) == {"add2", "add3", "mul1"}  # 40 draws reach every component here
    evals = table[table["split"] == "eval"]
    assert evals.groupby("task").size().to_dict() == {"main": 64, "hard": 64}


@pytest.fixture
def scorers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "mixture_scorers.py").write_text(
        "def plain(response, ground_truth):\n"
        "    return 1.0, {'scorer': 'plain'}\n"
        "def prefixed(response, ground_truth):\n"
        "    return 0.0, {'scorer': 'prefixed'}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mixture_scorers"
    sys.modules.pop("mixture_scorers", None)


def test_each_prompt_is_scored_by_its_own_tasks_verifier(model_dir: Path, scorers: str) -> None:
    cfg = config(
        model_dir,
        train_tasks=[
            {"name": "plain", "weight": 1, "task": {"reward_fn": f"{scorers}:plain"}},
            {
                "name": "prefixed",
                "weight": 1,
                "task": {"system_prompt": "q", "reward_fn": f"{scorers}:prefixed"},
            },
        ],
    )
    maker = GroupMaker(cfg, TrialSpec("grpo", 0, 0, "fixed"), "mixture-run", "gen-0")
    try:
        groups = maker.make(list(range(8)), version=0, stats=GeneratorStats())
    finally:
        maker.generator.close()
    seen = []
    for group in groups:
        prefixed = maker.tokenizer.decode(group.prompt_ids).startswith("q\n")
        want = ("prefixed", 0.0) if prefixed else ("plain", 1.0)
        for info, reward in zip(group.reward_infos, group.rewards, strict=True):
            assert (json.loads(info)["scorer"], reward) == want
        seen.append(prefixed)
    assert set(seen) == {True, False}  # both components drawn among the 8 tickets
