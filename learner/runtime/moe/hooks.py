"""Forward hooks on an MoE policy's routers: capture the experts of a forward, replay given ones.

The hooks (`learner.runtime.moe` says why the learner needs them) wrap the router modules, so
transformers is not patched and the hooks vanish when the context exits. Supported routers are
those whose forward is "softmax over experts, top-k, optional renormalisation" and returns
`(router_logits, scores, indices)`: the Qwen3-MoE and Qwen2-MoE `TopKRouter`s of transformers 5
(`modeling_qwen3_moe.py`). A model with none of them is treated as dense.

- `capture_routing` records each router's top-k expert indices during a forward, in the
  smallest integer dtype that holds the router's expert count (`index_dtype`: one byte a choice
  up to 256 experts), and of its logits only what the metrics need, each token's router entropy
  (`router_entropy`), reduced in the hook: the [tokens, experts] float32 logits are never kept;
- `replay_experts` / `replay_routing` make a forward use given top-k indices, with the gates
  still computed by the current router (`replayed_scores`); the indices are widened to int64
  (what `gather` and the experts' dispatch index with) one layer at a time, in the hook.
The torch generator records its rollouts' experts with the same capture.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

# Routers with the softmax -> top-k -> renormalise contract `replayed_scores` reproduces.
ROUTER_TYPES: tuple[type[nn.Module], ...] = (Qwen3MoeTopKRouter, Qwen2MoeTopKRouter)


def index_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer dtype holding every expert index 0 .. num_experts - 1: uint8 up to
    256 experts (Qwen3-30B-A3B's 128), int16 up to 32,768, int32 beyond."""
    if num_experts <= 2**8:
        return torch.uint8
    return torch.int16 if num_experts <= 2**15 else torch.int32


@dataclass(frozen=True)
class RoutingRecord:
    """Per-layer routing of one forward, reshaped to the batch: what replay and the metrics read.

    The router logits themselves are not kept: the metrics need only each token's entropy."""

    indices: Tensor  # (layers, B, L, k) chosen experts, `index_dtype(E)`, in the router's order
    entropy: Tensor  # (layers, B, L) router entropy per token (nats), float32
    num_experts: int  # E, the router's output width

    def rows(self, rows: Tensor, width: int | None = None) -> RoutingRecord:
        """The routing of a subset of batch rows (a minibatch), cut to their first `width`
        positions (a micro-batch trimmed to its longest row; None: all), where it is kept."""
        cut = (slice(None), rows.to(self.indices.device), slice(None, width))
        return RoutingRecord(self.indices[cut], self.entropy[cut], self.num_experts)


def router_modules(model: nn.Module) -> list[nn.Module]:
    """The model's supported routers, in forward (layer) order."""
    return [module for module in model.modules() if isinstance(module, ROUTER_TYPES)]


def is_moe(model: nn.Module) -> bool:
    return bool(router_modules(model))


def router_entropy(logits: Tensor) -> Tensor:
    """Entropy (nats) of the router's softmax over experts, per token: (..., E) -> (...) float32.

    The arithmetic `moe/router_entropy` has always used (float32 log-softmax, -sum p log p), so
    a token's value does not depend on whether it is reduced in the hook or from kept logits."""
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (..., E)
    return -(log_probs.exp() * log_probs).sum(-1)


class RoutingRecorder:
    """Filled by `capture_routing` during one forward; `routing(B, L)` reads it back."""

    def __init__(self, n_layers: int) -> None:
        self._entropy: list[Tensor | None] = [None] * n_layers
        self._indices: list[Tensor | None] = [None] * n_layers
        self._experts = 0

    def record(self, layer: int, logits: Tensor, indices: Tensor) -> None:
        """Keep the layer's chosen experts (in `index_dtype`) and its per-token entropy; the
        logits are dropped here, so a capture holds k + 4 bytes a token a layer up to 256
        experts (the router's int64 indices would be 8 k), not also 4 E."""
        if self._indices[layer] is not None:
            raise RuntimeError(
                f"router of MoE layer {layer} ran twice under one capture_routing; capture "
                "exactly one forward per context"
            )
        self._experts = int(logits.shape[-1])
        self._entropy[layer] = router_entropy(logits.detach())  # (N,), N = B * L
        self._indices[layer] = indices.detach().to(index_dtype(self._experts))  # (N, k)

    def routing(self, batch: int, length: int) -> RoutingRecord:
        entropy = [t for t in self._entropy if t is not None]
        return RoutingRecord(
            self.indices(batch, length),
            torch.stack([t.reshape(batch, length) for t in entropy]),  # (layers, B, L)
            self._experts,
        )

    def indices(self, batch: int, length: int) -> Tensor:
        """Only the chosen experts (layers, B, L, k): what a generator records per token."""
        indices = [t for t in self._indices if t is not None]
        if not indices or len(indices) != len(self._indices):
            raise RuntimeError("capture_routing saw no complete forward of the model")
        return torch.stack([t.reshape(batch, length, -1) for t in indices])


@contextmanager
def capture_routing(model: nn.Module) -> Iterator[RoutingRecorder]:
    """Record every router's top-k indices and per-token entropy during the one forward run
    inside (`RoutingRecorder.record`)."""
    routers = router_modules(model)
    recorder = RoutingRecorder(len(routers))
    handles = []
    for layer, router in enumerate(routers):

        def hook(_m: nn.Module, _args: object, output: tuple, layer: int = layer) -> None:
            logits, _scores, indices = output
            recorder.record(layer, logits, indices)

        handles.append(router.register_forward_hook(hook))
    try:
        yield recorder
    finally:
        for handle in handles:
            handle.remove()


def replayed_scores(router_logits: Tensor, indices: Tensor, norm_topk_prob: bool) -> Tensor:
    """Gates of given experts under the current router, as the router computes its own.

    Mirrors `Qwen3MoeTopKRouter.forward`: probs = softmax(logits) in float32 over all experts,
    the chosen experts' probs, divided by their sum when `norm_topk_prob`. For the router's own
    top-k indices `gather` returns exactly `topk`'s values, so the result is bitwise identical;
    gradients reach the router weights through `router_logits`, as without replay.
    """
    probs = F.softmax(router_logits, dtype=torch.float, dim=-1)  # (N, E)
    gates = probs.gather(-1, indices)  # (N, k)
    if norm_topk_prob:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return gates.to(router_logits.dtype)


def replay_routing(model: nn.Module, routing: RoutingRecord) -> AbstractContextManager[None]:
    """Forwards inside use `routing.indices` as every layer's top-k experts.

    `routing` must have the batch shape of the forward (select minibatch rows with
    `RoutingRecord.rows`); a mismatch raises instead of replaying another token's experts.
    """
    return replay_experts(model, routing.indices)


@contextmanager
def replay_experts(model: nn.Module, experts: Tensor) -> Iterator[None]:
    """Forwards inside route token (b, p) of layer l to `experts[l, b, p]` (layers, B, L, k),
    of any integer dtype, best already on the forward's device (else each hook copies its
    layer there)."""
    routers = router_modules(model)
    if len(routers) != experts.shape[0]:
        raise ValueError(
            f"replay_routing: routing has {experts.shape[0]} layers, the model "
            f"{len(routers)} routers; capture it from the same model"
        )
    handles = []
    for layer, router in enumerate(routers):
        indices = experts[layer].reshape(-1, experts.shape[-1])  # (N, k)

        def hook(
            module: nn.Module, _args: object, output: tuple, indices: Tensor = indices
        ) -> tuple[Tensor, Tensor, Tensor]:
            logits = output[0]  # (N, E)
            if logits.shape[0] != indices.shape[0]:
                raise ValueError(
                    f"replay_routing: forward routes {logits.shape[0]} tokens, the replayed "
                    f"routing holds {indices.shape[0]}; pass RoutingRecord.rows(...) of this "
                    "batch"
                )
            # int64 for gather and the experts' dispatch; one layer of one forward at a time.
            replayed = indices.to(device=logits.device, dtype=torch.int64)
            return logits, replayed_scores(logits, replayed, module.norm_topk_prob), replayed

        handles.append(router.register_forward_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
