"""The eval suite (run by the generators) on the built-in warm-started model: the default single
set scores exactly as the greedy eval always did; sampled scores come from the rollouts' own
seeded sampler, reproducibly, without touching the caller's RNG or train/eval mode; on a rollout
engine (`eval.engine: generator`) it scores that engine's greedy and seeded answers; MLflow keys
per set."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch

from contract.pass_at_k import pass_at_k
from harness.config import ExperimentConfig, load_config
from harness.evaluation.suite import eval_sample_seed, make_eval_suite, sampled_scores
from harness.experiment.trial_runs import eval_metric_batches
from harness.generators.base import GenRequest
from harness.generators.torch_backend import TorchGenerator
from harness.models.factory import load_policy
from harness.models.model_dir import build_model_dir
from harness.models.tokenizer import encode_prompt, load_tokenizer, response_text
from harness.models.warm_start import greedy_eval
from harness.tasks.factory import make_rendered_task
from harness.tasks.rewards import make_reward_fn

REPO = Path(__file__).resolve().parents[2]
TWO_SETS = [
    "evals=[{name: main}, {name: prefixed, task: {name: addition, eval_size: 24, "
    "system_prompt: q}}]",
    "eval.samples=4",
    "eval.pass_k=[1, 2, 4]",
    "task.eval_size=32",
]


def quickstart(*overrides: str) -> ExperimentConfig:
    return load_config(REPO / "configs/quickstart.yaml", list(overrides))


@pytest.fixture(scope="module")
def built() -> tuple[Path, Any]:
    cfg = quickstart()
    model_dir = build_model_dir(cfg.model, cfg.task)  # cached after the first build
    return model_dir, load_policy(model_dir, torch.float32, "cpu")


def test_without_evals_the_suite_is_the_old_greedy_eval(built) -> None:
    model_dir, model = built
    cfg = quickstart("evals=[]", "eval.samples=0", "eval.pass_k=[]")
    suite = make_eval_suite(cfg, model_dir, trial_seed=0)
    report = suite(model, 10)
    (score,) = report.scores
    assert (score.eval_set, score.n_prompts, score.samples) == ("heldout", cfg.task.eval_size, 0)
    assert math.isnan(score.pass1_sampled) and dict(score.pass_at_k) == {}
    # What make_evaluator computed before eval suites existed:
    tokenizer = load_tokenizer(model_dir)
    prompts = make_rendered_task(cfg.task, tokenizer).eval_prompts(cfg.task.eval_size)
    old = greedy_eval(model, tokenizer, make_reward_fn(cfg.task), prompts, max_new_tokens=8)
    assert report.pass_rate == old.pass_rate
    assert 0.1 < old.pass_rate < 0.6  # warm-started: informative, not solved


def test_sampled_scores_by_hand() -> None:
    # c = 0, 2, 4 of n = 4: pass1 = (0 + 1/2 + 1) / 3 = 1/2; pass@2 = (0 + 5/6 + 1) / 3 = 11/18.
    pass1, at_k = sampled_scores([0, 2, 4], 4, [1, 2, 4])
    assert pass1 == 0.5
    assert at_k[1] == pytest.approx(0.5, rel=1e-12)
    assert at_k[2] == pytest.approx(11 / 18, rel=1e-12)
    assert at_k[4] == pytest.approx(2 / 3, rel=1e-12)  # any correct: 2 of 3 prompts


def test_two_sets_greedy_and_sampled(built) -> None:
    model_dir, model = built
    cfg = quickstart(*TWO_SETS)
    suite = make_eval_suite(cfg, model_dir, trial_seed=3)
    model.train()
    rng_before = torch.get_rng_state()
    report = suite(model, 20)
    assert model.training  # restored
    assert torch.equal(torch.get_rng_state(), rng_before)  # own generators only
    main = report.scores[0]
    assert [(s.eval_set, s.n_prompts, s.samples) for s in report.scores] == [
        ("main", 32, 4),
        ("prefixed", 24, 4),
    ]
    assert report.pass_rate == main.greedy_pass_rate
    ids = dict(eos_token_id=suite.tokenizer.eos_token_id, pad_token_id=suite.tokenizer.pad_token_id)
    sampler = TorchGenerator.around(model, sampling=suite.sampling, **ids)
    for score, eval_set in zip(report.scores, suite.sets, strict=True):
        counts = suite.sampled_correct(eval_set, sampler, 20)  # the same seeds: the same draws
        assert score.pass1_sampled == sum(c / 4 for c in counts) / len(counts)
        for k in (1, 2, 4):
            by_hand = sum(pass_at_k(4, c, k) for c in counts) / len(counts)
            assert score.pass_at_k[k] == by_hand
    assert main.pass_at_k[4] > 0  # the warm-started model solves some prompts when sampling
    assert suite(model, 20) == report  # bitwise reproducible
    assert suite(model, 30) != report  # another step draws other samples


def test_sampled_evals_use_the_rollout_sampler(built) -> None:
    """`TorchGenerator.around` the in-memory model draws what the generator loading the same
    weights from disk draws with the same seeds (temperature, top-p, top-k applied alike)."""
    model_dir, model = built
    cfg = quickstart(*TWO_SETS, "generation.temperature=0.7", "generation.top_k=5")
    suite = make_eval_suite(cfg, model_dir, trial_seed=3)
    tokenizer = suite.tokenizer
    prompt = suite.sets[1].prompts[0]
    seeds = [eval_sample_seed(3, 20, "prefixed", prompt.index, j) for j in range(4)]
    request = GenRequest(encode_prompt(tokenizer, prompt.text), seeds, max_new_tokens=8)
    sampling = cfg.generation.sampling()
    ids = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    (around,) = TorchGenerator.around(model, sampling=sampling, **ids).generate([request])
    loaded = TorchGenerator(model_dir, sampling=sampling, threads=1, **ids)
    (from_disk,) = loaded.generate([request])
    assert around.response_ids == from_disk.response_ids
    for ours, theirs in zip(around.behavior_logprobs, from_disk.behavior_logprobs, strict=True):
        # float32 rounding of two model instances (thread pools differ): ~1e-6
        assert ours == pytest.approx(theirs, abs=1e-5)
    assert len(set(seeds)) == 4 and seeds[0] != eval_sample_seed(3, 20, "main", prompt.index, 0)


def test_on_an_engine_the_suite_scores_the_engines_own_answers(built) -> None:
    """`eval.engine: generator`: greedy from the engine's argmax decoding, samples from its
    seeded sampler with the eval seeds; by hand from the same engine calls, reproducibly."""
    model_dir, _ = built
    cfg = quickstart(*TWO_SETS)
    suite = make_eval_suite(cfg, model_dir, trial_seed=3)
    tokenizer = suite.tokenizer
    engine = TorchGenerator(
        model_dir,
        sampling=suite.sampling,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        threads=1,
    )
    report = suite.on_engine(engine, 20)
    assert [(s.eval_set, s.n_prompts, s.samples) for s in report.scores] == [
        ("main", 32, 4),
        ("prefixed", 24, 4),
    ]
    for score, eval_set in zip(report.scores, suite.sets, strict=True):
        answers = engine.greedy([encode_prompt(tokenizer, p.text) for p in eval_set.prompts], 8)
        rewards = [
            eval_set.reward_fn(response_text(tokenizer, ids), p.ground_truth)[0]
            for p, ids in zip(eval_set.prompts, answers, strict=True)
        ]
        assert score.greedy_pass_rate == sum(r >= 1 for r in rewards) / len(rewards)
        counts = suite.sampled_correct(eval_set, engine, 20)
        assert score.pass1_sampled == sum(c / 4 for c in counts) / len(counts)
        assert score.pass_at_k[4] == sum(c > 0 for c in counts) / len(counts)
    assert 0.1 < report.pass_rate < 0.6  # the warm-started model, as on the torch copy
    assert suite.on_engine(engine, 20) == report


def test_eval_rows_become_mlflow_metrics_per_set() -> None:
    table = pa.table(
        {
            "step": pa.array([0, 0, 5], pa.int64()),
            "eval_set": ["main", "hard", "main"],
            "n_prompts": pa.array([8, 8, 8], pa.int64()),
            "greedy_pass_rate": [0.25, 0.0, 0.5],
            "samples": pa.array([2, 2, 2], pa.int64()),
            "pass1_sampled": [0.125, 0.0, 0.375],
            "pass_at_2": [0.25, 0.0, 0.5],
        }
    )
    (batch,) = eval_metric_batches(table, now_ms=1000)
    assert [(m.key, m.value, m.step) for m in batch] == [
        ("eval/main/greedy_pass_rate", 0.25, 0),
        ("eval/main/pass1", 0.125, 0),
        ("eval/main/pass_at_2", 0.25, 0),
        ("eval/hard/greedy_pass_rate", 0.0, 0),
        ("eval/hard/pass1", 0.0, 0),
        ("eval/hard/pass_at_2", 0.0, 0),
        ("eval/main/greedy_pass_rate", 0.5, 5),
        ("eval/main/pass1", 0.375, 5),
        ("eval/main/pass_at_2", 0.5, 5),
    ]
