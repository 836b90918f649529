"""Mixture-of-experts routing: capture the old policy's experts, replay them, measure drift.

Why this exists (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071,
sec. 5.3 "Benefit of GSPO for MoE training"): in an MoE policy the experts a token is routed to
can change between pi_old and pi_theta, so GRPO's token ratio pi_theta(y_t) / pi_old(y_t) is taken
between two different sub-networks. The paper's GRPO baseline needs *routing replay* - cache the
experts pi_old activated and reuse them in pi_theta's forward - while GSPO's sequence ratio does
not. This module supplies that option and the diagnostics that show the effect:

- `capture_routing` records each router's top-k expert indices during a forward, and of its
  logits only what the metrics need, each token's router entropy (`router_entropy`), reduced in
  the hook: the [tokens, experts] float32 logits are never kept (at the GSPO paper's scale,
  Qwen3-30B-A3B, 48 layers x 128 experts, they were 24 KiB a token);
- `replay_routing` makes a forward use given top-k indices, with the gates still computed by the
  current router (softmax over all experts, gathered at the replayed experts and renormalised
  when `norm_topk_prob`, exactly as the router computes them for its own choice);
- `routing_metrics` turns two captures into `moe/*` metrics (pure functions of tensors);
- `StepRouting` is the small object `learner.runtime.step.train_on_batch` calls. Its forwards
  (pi_old's, and the routing forward of the metrics) run in the step's micro-batches
  (`learner.micro_batch_tokens`), each captured on its own and put back in the batch's rows
  (`place`): a routing pass holds one micro-batch's activations, as a dense pass does, beside
  the batch's record of experts and entropies (8 k + 4 bytes a token a sparse layer).

Routing replay comes in two flavours (`ArmConfig.routing_replay`):
- `old` (R2-style): replay the experts of the learner's own start-of-step forward, so pi_theta
  and pi_old share a sub-network; the behaviour policy (the generator) may still have routed
  differently.
- `rollout` (R3, Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning Training and
  Inference Routers", arXiv:2510.11370): replay the experts the *generator* routed each token to
  (recorded by the torch generator, carried by schema-v2 rollout records, collated into
  `RolloutBatch.routed_experts`) in the pi_old forward and in every minibatch forward, so the
  learner's log-probs are taken on the sampler's sub-network and the training-inference routing
  mismatch is removed; the gates stay differentiable through the learner's router.

Both work through forward hooks on the router modules, so transformers is not patched and the
hooks vanish when the context exits. Supported routers are those whose forward is "softmax over
experts, top-k, optional renormalisation" and returns `(router_logits, scores, indices)`: the
Qwen3-MoE and Qwen2-MoE `TopKRouter`s of transformers 5 (`modeling_qwen3_moe.py`). A model with
none of them is treated as dense.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

from contract import metrics as M
from learner.algorithms.masking import masked_mean
from learner.runtime.update import MicroBatch, take
from learner.vocabulary import RoutingReplay

MOE_METRICS = (M.MOE_LOAD_IMBALANCE, M.MOE_ROUTER_ENTROPY, M.MOE_ROUTING_CHANGE_FRAC)
ROLLOUT_METRICS = (M.MOE_ROLLOUT_ROUTING_MISMATCH,)  # only when the batch carries routing
# Routers with the softmax -> top-k -> renormalise contract `replayed_scores` reproduces.
ROUTER_TYPES: tuple[type[nn.Module], ...] = (Qwen3MoeTopKRouter, Qwen2MoeTopKRouter)


@dataclass(frozen=True)
class Routing:
    """Per-layer routing of one forward, reshaped to the batch: what replay and the metrics read.

    The router logits themselves are not kept: the metrics need only each token's entropy."""

    indices: Tensor  # (layers, B, L, k) chosen experts, int64, in the router's order
    entropy: Tensor  # (layers, B, L) router entropy per token (nats), float32
    num_experts: int  # E, the router's output width

    def rows(self, rows: Tensor, width: int | None = None) -> Routing:
        """The routing of a subset of batch rows (a minibatch), cut to their first `width`
        positions (a micro-batch trimmed to its longest row; None: all)."""
        cut = (slice(None), rows, slice(None, width))
        return Routing(self.indices[cut], self.entropy[cut], self.num_experts)


def blank_routing(like: Routing, batch: int, length: int) -> Routing:
    """A `batch` x `length` routing with `like`'s layers, top-k and experts, before any
    micro-batch is placed in it (`place`).

    What stays of it is at the positions no micro-batch computes, beyond its width: padding
    only (a part is as wide as its longest row). There every token gets experts 0..k-1 (a valid
    set, as `buffer.collate` fills the generator's unrecorded positions) and entropy 0. Neither
    reaches a real token: a causal forward's output at p never depends on later positions (so
    replaying the fill into an update's padding changes no real token's log-prob), and the
    metrics read only positions that score a response token (`predicting_positions`)."""
    layers, _, _, top_k = like.indices.shape
    device = like.indices.device
    experts = torch.arange(top_k, device=device).expand(layers, batch, length, top_k)
    entropy = torch.zeros(layers, batch, length, dtype=like.entropy.dtype, device=device)
    return Routing(experts.clone(), entropy, like.num_experts)


def place(whole: Routing, piece: Routing, part: MicroBatch) -> None:
    """Write a micro-batch's routing (layers, b, width, ...) into its rows of `whole`, in place:
    rows `part.rows` of the step batch, positions up to the part's width."""
    width = piece.indices.shape[2]
    whole.indices[:, part.rows, :width] = piece.indices.to(whole.indices.device)
    whole.entropy[:, part.rows, :width] = piece.entropy.to(whole.entropy.device)


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
        """Keep the layer's chosen experts and its per-token entropy; the logits are dropped
        here, so a capture holds 8 k + 4 bytes a token a layer, not also 4 E."""
        if self._indices[layer] is not None:
            raise RuntimeError(
                f"router of MoE layer {layer} ran twice under one capture_routing; capture "
                "exactly one forward per context"
            )
        self._entropy[layer] = router_entropy(logits.detach())  # (N,), N = B * L
        self._indices[layer] = indices.detach()  # (N, k)
        self._experts = int(logits.shape[-1])

    def routing(self, batch: int, length: int) -> Routing:
        entropy = [t for t in self._entropy if t is not None]
        return Routing(
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


def replay_routing(model: nn.Module, routing: Routing) -> AbstractContextManager[None]:
    """Forwards inside use `routing.indices` as every layer's top-k experts.

    `routing` must have the batch shape of the forward (select minibatch rows with
    `Routing.rows`); a mismatch raises instead of replaying another token's experts.
    """
    return replay_experts(model, routing.indices)


@contextmanager
def replay_experts(model: nn.Module, experts: Tensor) -> Iterator[None]:
    """Forwards inside route token (b, p) of layer l to `experts[l, b, p]` (layers, B, L, k)."""
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
                    f"routing holds {indices.shape[0]}; pass Routing.rows(...) of this batch"
                )
            replayed = indices.to(logits.device)
            return logits, replayed_scores(logits, replayed, module.norm_topk_prob), replayed

        handles.append(router.register_forward_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def load_imbalance_per_layer(indices: Tensor, mask: Tensor, num_experts: int) -> Tensor:
    """max / mean tokens per expert over masked tokens, per layer [layers]; 1 = perfectly even.

    indices (layers, B, L, k); mask (B, L). Each token counts once for each of its k experts,
    so the mean load is tokens * k / E (Switch Transformer's notion of load, Fedus et al. 2021).
    """
    chosen = indices[:, mask.bool()]  # (layers, n, k)
    flat = chosen.reshape(chosen.shape[0], -1).cpu()  # (layers, n * k), counted on the host
    counts = torch.zeros(flat.shape[0], num_experts, dtype=torch.float64)  # (layers, E)
    counts.scatter_add_(1, flat, torch.ones_like(flat, dtype=torch.float64))
    return counts.max(dim=1).values / counts.mean(dim=1).clamp_min(1e-12)


def masked_mean_per_layer(values: Tensor, mask: Tensor) -> Tensor:
    """values (layers, B, L) averaged over the masked tokens (B, L), per layer [layers]."""
    return torch.stack([masked_mean(layer, mask) for layer in values])


def router_entropy_per_layer(logits: Tensor, mask: Tensor) -> Tensor:
    """Mean entropy (nats) of the router's softmax over experts, masked tokens, per layer, from
    logits (layers, B, L, E); the step reads the per-token entropy its capture kept instead."""
    return masked_mean_per_layer(router_entropy(logits), mask)


def routing_change_per_layer(old: Tensor, new: Tensor, mask: Tensor) -> Tensor:
    """Fraction of masked tokens whose top-k expert *set* differs, per layer [layers].

    Sets, not sequences: topk orders experts by gate value, and a swap of order routes the token
    through the same sub-network. One layer at a time, so the sorted copies are a layer's, not
    the batch record's (at the step's scale that is what the `moe/*` computation peaks on).
    """
    return torch.stack(
        [
            masked_mean(_set_changed(old_layer, new_layer).float(), mask)
            for old_layer, new_layer in zip(old, new, strict=True)
        ]
    )


def _set_changed(old: Tensor, new: Tensor) -> Tensor:
    """(B, L) True where the top-k expert sets (B, L, k) differ."""
    return (old.sort(dim=-1).values != new.sort(dim=-1).values).any(dim=-1)


def predicting_positions(response_mask: Tensor) -> Tensor:
    """Positions whose forward scores a response token: p - 1 for every response token p.

    The logprob of token p is read from the output at position p - 1 (`learner.runtime.forward`), so
    these are the positions whose routing the ratio pi_theta(y_t) / pi_old(y_t) depends on
    directly; the last response token's own position predicts nothing that is trained.
    """
    shifted = torch.zeros_like(response_mask)  # (B, L)
    shifted[:, :-1] = response_mask[:, 1:]
    return shifted


def routing_metrics(
    old: Routing, new: Routing, mask: Tensor, rollout: Tensor | None = None
) -> dict[str, float]:
    """The registered `moe/*` metrics, each averaged over layers.

    Load imbalance and router entropy describe `old` (the policy at the start of the step, like
    `policy/entropy`); the change fraction compares `old` with `new` (after the step's updates).
    Given the generator's `rollout` experts (layers, B, L, k), the rollout mismatch compares them
    with `old`: the share of positions where the learner's own router picks another expert set
    than the sampler did (what R3 replay removes).
    """
    mask = mask.float()
    names = MOE_METRICS + (ROLLOUT_METRICS if rollout is not None else ())
    if not bool(mask.any()):
        return {name: math.nan for name in names}
    rollout_stats = {}
    if rollout is not None:
        mismatch = routing_change_per_layer(old.indices, rollout.to(old.indices.device), mask)
        rollout_stats[M.MOE_ROLLOUT_ROUTING_MISMATCH] = float(mismatch.mean())
    return rollout_stats | {
        M.MOE_LOAD_IMBALANCE: float(
            load_imbalance_per_layer(old.indices, mask, old.num_experts).mean()
        ),
        M.MOE_ROUTER_ENTROPY: float(masked_mean_per_layer(old.entropy, mask).mean()),
        M.MOE_ROUTING_CHANGE_FRAC: float(
            routing_change_per_layer(old.indices, new.indices, mask).mean()
        ),
    }


PartContext = Callable[[MicroBatch], AbstractContextManager[None]]
"""What `StepRouting.capture_old` yields: the context to enter around one micro-batch's forward."""


def no_part_context(_part: MicroBatch) -> AbstractContextManager[None]:
    """The `PartContext` of a dense policy: nothing around any part."""
    return contextlib.nullcontext()


def is_whole(parts: list[MicroBatch]) -> bool:
    """One part at the batch's width (no `learner.micro_batch_tokens`): the batch itself, which
    is then used as it is, not copied row by row (`update.assemble` reads it the same way)."""
    return len(parts) == 1 and parts[0].width is None


def _width(part: MicroBatch, length: int) -> int:
    """The positions the micro-batch's forward computes: its width, or the batch's (None)."""
    return length if part.width is None else part.width


class _PartCaptures:
    """The step batch's routing, captured one micro-batch forward at a time (`around`).

    One part at the batch's width (no `learner.micro_batch_tokens`) is the batch's routing as
    captured, bit for bit and without a copy; several are placed into one `blank_routing` as
    they come, so a part's capture is dropped before the next forward runs."""

    def __init__(self, policy: nn.Module, parts: list[MicroBatch], batch: int, length: int) -> None:
        self.policy, self.parts, self.batch, self.length = policy, parts, batch, length
        self.whole: Routing | None = None
        self.captured = 0

    @contextmanager
    def around(self, part: MicroBatch) -> Iterator[None]:
        with capture_routing(self.policy) as recorder:
            yield
        piece = recorder.routing(int(part.rows.numel()), _width(part, self.length))
        self.captured += 1
        if is_whole(self.parts):
            self.whole = piece
            return
        if self.whole is None:
            self.whole = blank_routing(piece, self.batch, self.length)
        place(self.whole, piece, part)

    def routing(self) -> Routing:
        if self.whole is None or self.captured != len(self.parts):
            raise RuntimeError(
                f"routing captured for {self.captured} of {len(self.parts)} micro-batches: run "
                "each part's forward inside the context `StepRouting.capture_old` yields"
            )
        return self.whole


class StepRouting:
    """The MoE part of one learner step; every method is a no-op for a dense policy.

    1. `capture_old(parts)` wraps the start-of-step pass (pi_old under `old_logprobs:
       recompute`) in the step's micro-batches (`learner.micro_batch_tokens`, the parts of
       `step._score`): it yields the context each part's forward runs in, captures that part's
       routing, and on exit keeps the learner's own routing of the whole batch (`old`), put back
       in place (layers, B, L, k). So the pass holds one micro-batch's forward at a time, as a
       dense one does, plus the batch's record (experts and per-token router entropy, never
       the router logits);
    2. `replay(rows, width)` wraps a minibatch (or micro-batch, cut to `width` positions)
       forward: `routing_replay: old` replays `old`'s experts of those rows, `rollout` the
       generator's (`rollout`, from `RolloutBatch.routed_experts`);
    3. `metrics(mask)` runs one extra no-grad pass of the updated policy, in the same parts
       (the same on every rank, so FSDP's per-forward gathers match), and returns `moe/*` over
       the positions that score response tokens (`predicting_positions`).

    With `rollout` each part's start-of-step forward replays the generator's experts of its rows
    (pi_old on the sampler's sub-network), and `old` comes from one extra no-grad pass without
    replay, so `moe/routing_change_frac` compares the learner's own routing before and after the
    updates in every mode, and `moe/rollout_routing_mismatch` (whenever the batch carries
    routing) the learner's own start-of-step routing with the generator's. With `old` and
    `old_logprobs: behavior` the replayed experts are those of the learner's start-of-step
    weights, not the sampler's (at lag 0 the same weights; `rollout` replays the sampler's).

    A part computes its rows up to its width, its longest row; positions beyond are padding, and
    `old` holds a harmless fill there (`blank_routing`). At a real position a part's routing is
    the whole batch's up to float rounding of the router's inputs: a causal forward's output at
    p depends on the row's positions up to p only, and padding is masked out of attention.
    """

    def __init__(
        self,
        policy: nn.Module,
        replay: RoutingReplay,
        input_ids: Tensor,
        attention_mask: Tensor,
        rollout: Tensor | None = None,
    ) -> None:
        self.policy = policy
        self.active = is_moe(policy)
        if replay != "off" and not self.active:
            raise ValueError(
                f"routing_replay: {replay} needs an MoE policy with a supported router "
                f"({', '.join(t.__name__ for t in ROUTER_TYPES)}); this policy has none. Set "
                "model.arch: qwen3_moe, or routing_replay: off"
            )
        self.mode = replay
        self.input_ids, self.attention_mask = input_ids, attention_mask  # the step's batch
        self.batch, self.length = int(input_ids.shape[0]), int(input_ids.shape[1])
        if replay == "rollout" and rollout is None:
            raise ValueError(
                "routing_replay: rollout replays the experts the generator routed each token "
                "to, but this batch carries none: at least one of its groups has no "
                "routed_experts (only the torch generator records them, for an MoE policy; "
                "vLLM generators and schema-v1 records do not). Use generation.backend: torch, "
                "or routing_replay: old"
            )
        self.rollout = rollout if self.active else None
        if self.rollout is not None:
            _check_rollout(self.rollout, router_modules(policy), (self.batch, self.length))
        self.old: Routing | None = None
        self.parts: list[MicroBatch] = []  # the step's no-grad micro-batches, from capture_old

    @contextmanager
    def capture_old(self, parts: list[MicroBatch]) -> Iterator[PartContext]:
        """Yields `around`: enter `around(part)` around each part's pi_old forward (of
        `take(input_ids, part)`); `old` is the batch's routing once the context exits."""
        self.parts = parts
        if not self.active:
            yield no_part_context
            return
        if self.mode == "rollout":
            yield self._replay_rollout  # pi_old: the learner's weights on the generator's experts
            self.old = self._own_routing()  # the learner's own routing of the batch, no replay
            return
        captures = _PartCaptures(self.policy, parts, self.batch, self.length)
        yield captures.around
        self.old = captures.routing()

    def _replay_rollout(self, part: MicroBatch) -> AbstractContextManager[None]:
        assert self.rollout is not None  # checked in __init__
        whole = is_whole(self.parts)  # then no copy of the batch's routed experts
        experts = self.rollout if whole else self.rollout[:, part.rows, : part.width]
        return replay_experts(self.policy, experts)

    @torch.no_grad()
    def _own_routing(self) -> Routing:
        """The policy's own routing of the step's batch, from no-grad forwards without replay,
        one per micro-batch of `capture_old`'s parts.

        The routers are all it needs: `logits_to_keep=1` has the causal LM project only the
        last position, so no [tokens, vocabulary] logits are made for it."""
        captures = _PartCaptures(self.policy, self.parts, self.batch, self.length)
        whole = is_whole(self.parts)
        for part in self.parts:
            ids, attn = self.input_ids, self.attention_mask
            with captures.around(part):
                self.policy(
                    input_ids=ids if whole else take(ids, part),
                    attention_mask=attn if whole else take(attn, part),
                    use_cache=False,
                    logits_to_keep=1,
                )
        return captures.routing()

    def replay(self, rows: Tensor, width: int | None = None) -> AbstractContextManager[None]:
        if self.mode == "off" or not self.active:
            return contextlib.nullcontext()
        if self.mode == "rollout":
            assert self.rollout is not None  # checked in __init__
            return replay_experts(self.policy, self.rollout[:, rows, :width])
        if self.old is None:
            raise RuntimeError("StepRouting.replay before capture_old: pi_old's routing is unset")
        return replay_routing(self.policy, self.old.rows(rows, width))

    @torch.no_grad()
    def metrics(self, mask: Tensor) -> dict[str, float]:
        if not self.active:
            return {}
        if self.old is None:
            raise RuntimeError("StepRouting.metrics before capture_old: pi_old's routing is unset")
        new = self._own_routing()
        return routing_metrics(self.old, new, predicting_positions(mask), self.rollout)


def _check_rollout(rollout: Tensor, routers: list[nn.Module], shape: tuple[int, int]) -> None:
    """The generator's routing must fit this policy and batch, or replay would misroute."""
    layers, top_k = len(routers), int(routers[0].top_k)
    experts = int(routers[0].weight.shape[0])
    want = (layers, *shape, top_k)
    if tuple(rollout.shape) != want:
        raise ValueError(
            f"the batch's routed_experts have shape {tuple(rollout.shape)}, the policy and "
            f"batch need (layers, B, L, top_k) = {want}; the generator served another model"
        )
    if rollout.numel() and not 0 <= int(rollout.min()) <= int(rollout.max()) < experts:
        raise ValueError(
            f"the batch's routed_experts hold experts {int(rollout.min())}..{int(rollout.max())}"
            f", outside this policy's 0..{experts - 1}; the generator served another model"
        )
