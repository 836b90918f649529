"""The `moe/*` step metrics as pure functions of routing tensors (hand-worked in the tests):
load imbalance, router entropy and routing change, per layer over masked positions.

Load imbalance and routing change are ratios of integer counts (`expert_counts_per_layer`,
`changed_per_layer`), so a step can count them one micro-batch at a time and add the counts:
exact, whatever the split. `learner.runtime.moe.tally.routing_metrics` averages them over
layers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from learner.algorithms.masking import masked_mean
from learner.runtime.moe.hooks import router_entropy


def load_imbalance_per_layer(indices: Tensor, mask: Tensor, num_experts: int) -> Tensor:
    """max / mean tokens per expert over masked tokens, per layer [layers]; 1 = perfectly even.

    indices (layers, B, L, k); mask (B, L). Each token counts once for each of its k experts,
    so the mean load is tokens * k / E (Switch Transformer's notion of load, Fedus et al. 2021).
    """
    return load_imbalance_of_counts(expert_counts_per_layer(indices, mask, num_experts))


def expert_counts_per_layer(indices: Tensor, mask: Tensor, num_experts: int) -> Tensor:
    """Masked tokens routed to each expert, per layer (layers, E), float64 (exact integers),
    counted on the host; indices (layers, B, L, k) of any integer dtype, mask (B, L)."""
    chosen = indices[:, mask.bool().to(indices.device)]  # (layers, n, k)
    flat = chosen.reshape(chosen.shape[0], -1).cpu().long()  # (layers, n * k): scatter's index
    counts = torch.zeros(flat.shape[0], num_experts, dtype=torch.float64)  # (layers, E)
    return counts.scatter_add_(1, flat, torch.ones_like(flat, dtype=torch.float64))


def load_imbalance_of_counts(counts: Tensor) -> Tensor:
    """max / mean of each layer's expert counts (layers, E) -> [layers]."""
    return counts.max(dim=1).values / counts.mean(dim=1).clamp_min(1e-12)


def masked_mean_per_layer(values: Tensor, mask: Tensor) -> Tensor:
    """values (layers, B, L) averaged over the masked tokens (B, L), per layer [layers]; each
    layer is moved to the mask's device on its own (a host record never goes there whole)."""
    return torch.stack([masked_mean(layer.to(mask.device), mask) for layer in values])


def router_entropy_per_layer(logits: Tensor, mask: Tensor) -> Tensor:
    """Mean entropy (nats) of the router's softmax over experts, masked tokens, per layer, from
    logits (layers, B, L, E); the step reads the per-token entropy its capture kept instead."""
    return masked_mean_per_layer(router_entropy(logits), mask)


def routing_change_per_layer(old: Tensor, new: Tensor, mask: Tensor) -> Tensor:
    """Fraction of masked tokens whose top-k expert *set* differs, per layer [layers].

    Sets, not sequences: topk orders experts by gate value, and a swap of order routes the token
    through the same sub-network."""
    return change_fraction(changed_per_layer(old, new, mask), mask)


def changed_per_layer(old: Tensor, new: Tensor, mask: Tensor) -> Tensor:
    """Masked tokens whose top-k expert set differs between `old` and `new` (layers, B, L, k),
    per layer [layers], int64. One layer at a time, so the sorted copies are a layer's."""
    return rerouted_counts(old, new, mask)[0]


def rerouted_counts(old: Tensor, new: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Masked tokens whose top-k expert set differs between `old` and `new` (layers, B, L, k):
    per layer [layers], and in at least one layer (0-d), both int64.

    Why both: the GSPO argument is about a token's ratio, which changes when *any* of its layers
    routes it elsewhere; the R3 paper reports that share (94% of tokens re-routed in at least
    one layer on Qwen3-30B-A3B against ~10% of routers per layer). Were layers independent, a
    per-layer share p over n layers would re-route 1 - (1 - p)^n of the tokens, so a deep model
    turns a small per-layer share into most tokens; the any-layer count measures it instead of
    assuming it. Counts of disjoint row sets add exactly (`RoutingTally`)."""
    kept = mask.bool()  # (B, L)
    anywhere = torch.zeros_like(kept)
    per_layer = []
    for old_layer, new_layer in zip(old, new, strict=True):  # one layer's sorted copies at a time
        changed = _set_changed(old_layer, new_layer) & kept
        per_layer.append(changed.sum())
        anywhere |= changed
    return torch.stack(per_layer), anywhere.sum()


def change_fraction(changed: Tensor, mask: Tensor) -> Tensor:
    """Changed counts [layers] / masked tokens, float32: what `masked_mean` of the 0/1 change
    gives (its float32 sum of 0s and 1s is the exact count below 2^24 tokens)."""
    return changed.float() / mask.bool().sum().clamp_min(1)


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
