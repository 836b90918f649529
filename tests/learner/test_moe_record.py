"""pi_old's routing record (`learner.runtime.moe.record`) and the streamed `moe/*` metrics.

- Experts are kept in the smallest integer dtype that holds the expert count (uint8 up to 256,
  int16 beyond: a tiny random MoE of 300 experts routes to experts above 255), and replaying
  them (widened to int64 in the hook) is bitwise the router's own choice.
- The step's record of the batch is kept in host memory, and the metrics after the updates are
  counted one micro-batch at a time against its slices: exactly (==) the numbers today's
  whole-batch computation (`todays_routing_metrics`, the formula it replaced) gives from the two
  whole records, with and without the generator's routing.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from buffer.collate import RolloutBatch
from contract import metrics as M
from learner.algorithms.masking import masked_mean
from learner.runtime.forward import scoring
from learner.runtime.moe.hooks import (
    RoutingRecord,
    capture_routing,
    index_dtype,
    replay_routing,
    router_modules,
)
from learner.runtime.moe.metrics import predicting_positions
from learner.runtime.moe.routing import StepRouting
from learner.runtime.update import take
from tests.learner.test_moe import moe_batch
from tests.learner.test_moe_micro_batch import BUDGET, step_parts
from tests.tiny_models import MOE_POLICY, TinyArch, tiny_model

# 300 experts of width 4 (16 wide, 2 layers): most top-2 choices are above 255 at random init.
WIDE_MOE = TinyArch(hidden=16, intermediate=4, layers=2, initializer_range=0.2, experts=300)
MODELS = {"4_experts": MOE_POLICY, "300_experts": WIDE_MOE}


def todays_routing_metrics(
    old: RoutingRecord, new: RoutingRecord, mask: torch.Tensor, rollout: torch.Tensor | None = None
) -> dict[str, float]:
    """`moe.routing_metrics` as it was: float32 masked means and host counts over the whole
    batch's records (int64 experts); the largest layer's change and the tokens changed in any
    layer (added later) the same way."""
    mask = mask.float()

    def changed_sets(a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
        return [
            (x.sort(-1).values != y.sort(-1).values).any(-1).float()
            for x, y in zip(a, b, strict=True)
        ]  # (B, L) each layer

    def change(a: torch.Tensor, b: torch.Tensor, how: str = "mean") -> float:
        per_layer = torch.stack([masked_mean(s, mask) for s in changed_sets(a, b)])
        return float(per_layer.max() if how == "max" else per_layer.mean())

    def any_layer(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(masked_mean(torch.stack(changed_sets(a, b)).amax(0), mask))

    chosen = old.indices.long()[:, mask.bool()]  # (layers, n, k)
    flat = chosen.reshape(chosen.shape[0], -1).cpu()
    counts = torch.zeros(flat.shape[0], old.num_experts, dtype=torch.float64)
    counts.scatter_add_(1, flat, torch.ones_like(flat, dtype=torch.float64))
    imbalance = counts.max(dim=1).values / counts.mean(dim=1).clamp_min(1e-12)
    entropy = torch.stack([masked_mean(layer, mask) for layer in old.entropy])
    stats = {}
    if rollout is not None:
        stats[M.MOE_ROLLOUT_ROUTING_MISMATCH] = change(old.indices, rollout)
        stats[M.MOE_ROLLOUT_TOKEN_REROUTED_FRAC] = any_layer(old.indices, rollout)
    before, after = old.indices.long(), new.indices.long()
    per_layer = {
        M.moe_routing_change_layer(i): float(masked_mean(layer, mask))
        for i, layer in enumerate(changed_sets(before, after))
    }  # each sparse layer's share (added later still)
    return (
        stats
        | per_layer
        | {
            M.MOE_LOAD_IMBALANCE: float(imbalance.mean()),
            M.MOE_ROUTER_ENTROPY: float(entropy.mean()),
            M.MOE_ROUTING_CHANGE_FRAC: change(before, after),
            M.MOE_ROUTING_CHANGE_MAX: change(before, after, "max"),
            M.MOE_TOKEN_REROUTED_FRAC: any_layer(before, after),
        }
    )


def test_index_dtype_is_the_smallest_that_holds_the_experts() -> None:
    assert index_dtype(4) == index_dtype(256) == torch.uint8
    assert index_dtype(257) == index_dtype(32_768) == torch.int16
    assert index_dtype(32_769) == torch.int32


@pytest.mark.parametrize("name", sorted(MODELS))
def test_compact_experts_replay_as_the_routers_own_choice(name: str) -> None:
    model = tiny_model(MODELS[name]).eval()
    batch = moe_batch(model)
    ids, attn = batch.input_ids, batch.attention_mask
    chosen: list[torch.Tensor] = []  # each router's own int64 top-k (N, k)
    handles = [
        router.register_forward_hook(lambda _m, _a, out: chosen.append(out[2]))
        for router in router_modules(model)
    ]
    with torch.no_grad(), capture_routing(model) as recorder:
        plain = model(input_ids=ids, attention_mask=attn).logits
    for handle in handles:
        handle.remove()
    routing = recorder.routing(*ids.shape)
    experts = MODELS[name].experts
    assert routing.indices.dtype == (torch.uint8 if experts <= 256 else torch.int16)
    own = torch.stack([c.reshape(*ids.shape, -1) for c in chosen])  # (layers, B, L, k) int64
    assert torch.equal(routing.indices.long(), own)  # no expert lost to the narrow dtype
    if experts > 256:
        assert int(own.max()) > 255  # the int16 case is exercised
    with torch.no_grad(), replay_routing(model, routing):
        replayed = model(input_ids=ids, attention_mask=attn).logits
    assert torch.equal(replayed, plain)


def old_pass_in_parts(model: torch.nn.Module, batch: RolloutBatch, mode: str) -> StepRouting:
    """pi_old's no-grad pass of the step in the budget's parts, routing captured (or, under
    rollout, replayed and the own routing captured after)."""
    ids, attn = batch.input_ids, batch.attention_mask
    routing = StepRouting(model, mode, ids, attn, batch.routed_experts)
    parts = step_parts(batch, BUDGET)
    assert len(parts) >= 3
    with scoring(model), routing.capture_old(parts) as around:
        for part in parts:
            with around(part):
                model(input_ids=take(ids, part), attention_mask=take(attn, part))
    return routing


@pytest.mark.parametrize(
    ("name", "mode"), [(n, "old") for n in MODELS] + [("4_experts", "rollout")]
)
def test_streamed_metrics_are_todays_whole_batch_metrics_exactly(name: str, mode: str) -> None:
    model = tiny_model(MODELS[name]).eval()
    batch = moe_batch(model)
    if mode == "rollout":  # another model's routing of the batch, as the generator's
        with torch.no_grad(), capture_routing(other := tiny_model(MODELS[name], seed=1)) as rec:
            other(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        batch = dataclasses.replace(
            batch, routed_experts=rec.indices(*batch.input_ids.shape).long()
        )
    routing = old_pass_in_parts(model, batch, mode)
    assert routing.old is not None
    assert routing.old.indices.device.type == "cpu"  # the record is in host memory
    assert routing.old.indices.dtype == index_dtype(MODELS[name].experts)
    with torch.no_grad():  # "the updates": every router moves, some tokens change experts
        for router in router_modules(model):
            router.weight.add_(
                0.3 * torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(5))
            )
    with scoring(model):
        streamed = routing.metrics(batch.response_mask)
        new = routing._own_routing()  # today's second whole-batch record
    scored = predicting_positions(batch.response_mask)
    today = todays_routing_metrics(routing.old, new, scored, routing.rollout)
    assert streamed == today  # bit for bit, every metric
    assert streamed[M.MOE_ROUTING_CHANGE_FRAC] > 0
    # a token re-routed in any layer is at least as common as in the most-changed layer
    assert streamed[M.MOE_TOKEN_REROUTED_FRAC] >= streamed[M.MOE_ROUTING_CHANGE_MAX]
    assert streamed[M.MOE_ROUTING_CHANGE_MAX] >= streamed[M.MOE_ROUTING_CHANGE_FRAC]
    if mode == "rollout":
        assert streamed[M.MOE_ROLLOUT_ROUTING_MISMATCH] > 0
