"""R3 (`routing_replay: rollout`): the torch generator records its experts, the record and collate
carry them, and the learner replays them.

Real parts throughout: the tiny random Qwen3-MoE of the generator tests (8 experts, top-2, 2
layers, wide init), the TorchGenerator, the Arrow codec and collate, and the learner's forward.

Tolerance against behaviour log-probs: TOL = 1e-4 (observed ~4e-6). With replay the learner runs
exactly the generator's experts, so what remains is the float32 gap between the generator's
cached, left-padded, one-token-at-a-time forwards and the learner's full right-padded forward
(different matmul shapes round differently): the engine gap every dense model has too, not a
routing effect. What *is* exact: at identical weights the replayed log-probs equal the learner's
unreplayed ones bitwise (same experts, same order, so `replayed_scores` reproduces the router's
gates bit for bit).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
import torch

from buffer.collate import RolloutBatch, collate
from buffer.rollout_group import RolloutGroup
from buffer.schema import decode_group, encode_group
from contract import metrics as M
from harness.config import ConfigError, load_config
from harness.generators import GenRequest, GenResult
from harness.generators.torch_backend import TorchGenerator, _cut_routing
from learner.algorithms.sampling_dist import PLAIN
from learner.config import LearnerConfig, make_arm
from learner.runtime.forward import policy_logprobs, scoring
from learner.runtime.models import build_step_models
from learner.runtime.moe.hooks import capture_routing, replay_experts
from learner.runtime.moe.logratio import LOGRATIO_METRICS
from learner.runtime.moe.metrics import predicting_positions, routing_change_per_layer
from learner.runtime.moe.routing import StepRouting
from learner.runtime.moe.tally import MOE_METRICS, ROLLOUT_METRICS
from learner.runtime.step import train_on_batch
from tests.harness.test_generators_torch import TOL, load_reference, requests_for
from tests.learner.test_moe import whole_batch
from tests.tiny_models import CHAR_DENSE, CHAR_MOE, save_tiny_model_dir

LAYERS, TOP_K = CHAR_MOE.layers, CHAR_MOE.experts_per_token
GROUP = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model_dir(tmp_path_factory.mktemp("moe"), CHAR_MOE)


@pytest.fixture(scope="module")
def generated(model_dir: Path) -> tuple[list[GenRequest], list[GenResult]]:
    generator = TorchGenerator(model_dir, sampling=PLAIN, eos_token_id=1, pad_token_id=0,
                               threads=1)  # fmt: skip
    requests = requests_for(step=0, group=GROUP)  # prompts of 6, 2 and 4 tokens
    return requests, generator.generate(requests)


def groups_of(requests: list[GenRequest], results: list[GenResult]) -> list[RolloutGroup]:
    """Rollout records as the generator process builds them, through the Arrow codec."""
    groups = []
    for index, (request, result) in enumerate(zip(requests, results, strict=True)):
        n = len(result.response_ids)
        group = RolloutGroup(
            run_id="r", group_id=f"g{index}", prompt_index=index, prompt_ids=request.prompt_ids,
            response_ids=result.response_ids, behavior_logprobs=result.behavior_logprobs,
            rewards=[float(j % 2) for j in range(n)], reward_infos=["{}"] * n,
            finish_reasons=result.finish_reasons, policy_version=0, generator_id="gen",
            created_at=datetime.now(UTC), routed_experts=result.routed_experts,
        )  # fmt: skip
        groups.append(decode_group(encode_group(group)))
    return groups


@pytest.fixture(scope="module")
def batch(generated: tuple[list[GenRequest], list[GenResult]]) -> RolloutBatch:
    return collate(groups_of(*generated), pad_id=0)


def recorded_positions(batch: RolloutBatch) -> torch.Tensor:
    """(B, L) True on the P + R - 1 positions the generator ran a forward on."""
    total = batch.prompt_lengths + batch.response_lengths  # (B,)
    return torch.arange(batch.input_ids.shape[1])[None, :] < (total - 1)[:, None]


# ---- the generator records every position of every row -----------------------------------------


def test_cut_routing_by_hand() -> None:
    # Two rows, one layer, top-1. Prefill width 3: row 0's prompt fills columns 0..2 (P = 3),
    # row 1's only column 2 (P = 1, left-padded). Values: prefill 10 * row + column, decode
    # forward j: 100 * j + row. Row 0 has R = 3 tokens, so it fed tokens 0 and 1 (forwards 1, 2);
    # row 1 stopped after R = 1 token: its later decode entries (pads) are dropped.
    prefill = torch.tensor([[0, 1, 2], [10, 11, 12]]).reshape(1, 2, 3, 1)
    decode = [torch.tensor([100 * j, 100 * j + 1]).reshape(1, 2, 1, 1) for j in (1, 2)]
    rows = _cut_routing(
        [prefill, *decode], prompt_lengths=[3, 1], lengths=[3, 1], width=prefill.shape[2]
    )
    assert [r.tolist() for r in rows] == [[[[0]], [[1]], [[2]], [[100]], [[200]]], [[[12]]]]
    assert all(r.dtype == np.int16 and r.flags.c_contiguous for r in rows)


def test_generator_records_every_fed_position(
    generated: tuple[list[GenRequest], list[GenResult]],
) -> None:
    requests, results = generated
    lengths = [len(ids) for result in results for ids in result.response_ids]
    assert len(set(lengths)) > 1  # rows finished at different decode steps
    for request, result in zip(requests, results, strict=True):
        assert result.routed_experts is not None
        for ids, experts in zip(result.response_ids, result.routed_experts, strict=True):
            assert experts.shape == (len(request.prompt_ids) + len(ids) - 1, LAYERS, TOP_K)
            assert experts.dtype == np.int16 and experts.min() >= 0
            assert experts.max() < CHAR_MOE.experts


def test_recorded_routing_is_the_models_own_at_equal_weights(
    model_dir: Path, batch: RolloutBatch
) -> None:
    """Position alignment end to end: generator -> record -> collate vs a full forward."""
    model = load_reference(model_dir)
    with scoring(model), capture_routing(model) as recorder:
        policy_logprobs(model, batch.input_ids, batch.attention_mask)
    own = recorder.indices(*batch.input_ids.shape)  # (layers, B, L, k)
    recorded = recorded_positions(batch)
    assert torch.equal(own[:, recorded], batch.routed_experts[:, recorded])


def test_dense_generator_records_nothing(tmp_path: Path) -> None:
    dense = save_tiny_model_dir(tmp_path, CHAR_DENSE)
    generator = TorchGenerator(dense, sampling=PLAIN, eos_token_id=1, pad_token_id=0,
                               threads=1)  # fmt: skip
    results = generator.generate(requests_for(step=0, max_new_tokens=3, group=2))
    assert all(result.routed_experts is None for result in results)


# ---- the learner replays them ------------------------------------------------------------------


def test_r3_reproduces_the_behaviour_logprobs(model_dir: Path, batch: RolloutBatch) -> None:
    model = load_reference(model_dir)
    ids, attn, mask = batch.input_ids, batch.attention_mask, batch.response_mask
    routing = StepRouting(model, "rollout", ids, attn, batch.routed_experts)
    parts = whole_batch(batch)
    with scoring(model):
        with routing.capture_old(parts) as around, around(parts[0]):
            r3_lp, _ = policy_logprobs(model, ids, attn)  # pi_old on the sampler's experts
        own_lp, _ = policy_logprobs(model, ids, attn)
    response = mask.bool()
    gap = (r3_lp - batch.behavior_logprobs)[response].abs().max().item()
    assert gap < TOL  # see the module docstring
    assert torch.equal(r3_lp[response], own_lp[response])  # same experts: bit for bit
    # Minibatch replay (rows of group 1) gives the same log-probs as the whole batch.
    rows = torch.arange(GROUP, 2 * GROUP)
    with scoring(model), routing.replay(rows):
        minibatch_lp, _ = policy_logprobs(model, ids[rows], attn[rows])
    assert torch.equal(minibatch_lp[response[rows]], r3_lp[rows][response[rows]])
    metrics = routing.metrics(mask)
    assert metrics[M.MOE_ROLLOUT_ROUTING_MISMATCH] == 0.0  # same weights, same experts
    assert metrics[M.MOE_ROUTING_CHANGE_FRAC] == 0.0  # no update in between


def perturb_routers(model: torch.nn.Module, scale: float) -> None:
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in model.model.layers:
            gate = layer.mlp.gate.weight
            gate.add_(scale * torch.randn(gate.shape, generator=generator))


def test_replay_matters_when_the_router_has_moved(model_dir: Path, batch: RolloutBatch) -> None:
    model = load_reference(model_dir)
    perturb_routers(model, scale=0.3)  # the learner's router now differs from the sampler's
    ids, attn, mask = batch.input_ids, batch.attention_mask, batch.response_mask
    recorded = recorded_positions(batch)
    with scoring(model), capture_routing(model) as own_capture:
        plain_lp, _ = policy_logprobs(model, ids, attn)
    own = own_capture.indices(*ids.shape)
    # Without replay the learner routes some recorded positions elsewhere...
    assert not torch.equal(own[:, recorded], batch.routed_experts[:, recorded])
    # ...with replay every position runs the recorded experts (the capture hook, registered
    # after the replay hooks, sees what the experts were actually given).
    replay = replay_experts(model, batch.routed_experts)
    with scoring(model), replay, capture_routing(model) as used_capture:
        replayed_lp, _ = policy_logprobs(model, ids, attn)
    used = used_capture.indices(*ids.shape)
    assert torch.equal(used[:, recorded], batch.routed_experts[:, recorded])
    response = mask.bool()
    assert not torch.equal(replayed_lp[response], plain_lp[response])
    # StepRouting measures the mismatch on the scored positions from an unreplayed forward.
    routing = StepRouting(model, "rollout", ids, attn, batch.routed_experts)
    parts = whole_batch(batch)
    with scoring(model), routing.capture_old(parts) as around, around(parts[0]):
        step_lp, _ = policy_logprobs(model, ids, attn)
    assert torch.equal(step_lp, replayed_lp)
    scored = predicting_positions(mask)
    expected = routing_change_per_layer(own, batch.routed_experts, scored).mean().item()
    metrics = routing.metrics(mask)
    assert metrics[M.MOE_ROLLOUT_ROUTING_MISMATCH] == pytest.approx(expected, rel=1e-6)
    assert expected > 0
    # old = the learner's own unreplayed routing, so no update means no routing change.
    assert metrics[M.MOE_ROUTING_CHANGE_FRAC] == 0.0


def test_r3_arm_trains(model_dir: Path, batch: RolloutBatch) -> None:
    arm = make_arm(name="grpo_r3", objective="grpo", routing_replay="rollout")
    cfg = LearnerConfig(prompts_per_step=3, minibatches=2, lr=1e-2, old_logprobs="recompute")
    models = build_step_models(model_dir, arm, cfg, total_steps=2)
    first = train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=GROUP, max_len=12, version=0
    ).metrics
    assert first[M.MOE_ROLLOUT_ROUTING_MISMATCH] == 0.0  # version 0: the generator's weights
    assert first[M.MOE_ROLLOUT_TOKEN_REROUTED_FRAC] == 0.0  # ... in no layer either
    assert first[M.MISMATCH_KL_BEHAVIOR] < 1e-9  # pi_old on the sampler's experts: float noise
    second = train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=GROUP, max_len=12, version=1
    ).metrics
    for metrics in (first, second):
        moe = {k: v for k, v in metrics.items() if k.startswith("moe/")}
        layers = {M.moe_routing_change_layer(i) for i in range(LAYERS)}
        # the batch carries routing; every MoE step weighs routing's share of the log-ratio
        assert set(moe) == {*MOE_METRICS, *ROLLOUT_METRICS, *LOGRATIO_METRICS, *layers}
        assert all(math.isfinite(v) for v in moe.values()), moe


# ---- refusals ----------------------------------------------------------------------------------


def test_rollout_replay_without_routing_is_refused(model_dir: Path, batch: RolloutBatch) -> None:
    model = load_reference(model_dir)
    with pytest.raises(ValueError, match=r"routing_replay: rollout .* carries none"):
        StepRouting(model, "rollout", batch.input_ids, batch.attention_mask, None)
    shorter = batch.routed_experts[:, :, :-1]
    with pytest.raises(ValueError, match="routed_experts have shape"):
        StepRouting(model, "rollout", batch.input_ids, batch.attention_mask, shorter)
    foreign = batch.routed_experts + CHAR_MOE.experts
    with pytest.raises(ValueError, match=r"outside this policy's 0\.\.7"):
        StepRouting(model, "rollout", batch.input_ids, batch.attention_mask, foreign)


def _config(tmp_path: Path, backend: str, arch: str = "qwen3_moe"):
    text = (
        "arms:\n  - {name: r3, objective: grpo, routing_replay: rollout}\n"
        f"model: {{arch: {arch}}}\ngeneration: {{backend: {backend}}}\n"
    )
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(path)


def test_config_refuses_rollout_replay_with_vllm(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"routing_replay=rollout.*generation\.backend=vllm"):
        _config(tmp_path, "vllm")
    assert _config(tmp_path, "torch").arm("r3").routing_replay == "rollout"
    with pytest.raises(ConfigError, match=r"model\.arch=qwen2"):
        _config(tmp_path, "torch", arch="qwen2")
