"""Padded tensors for the learner, built from flat token buffers (no per-token Python loops).

Position convention (read this before writing a loss): every [B, L] tensor is indexed by the
position of a token in `input_ids` = prompt tokens then response tokens, right-padded with
`pad_id`. `behavior_logprobs[b, p]` is log pi_behavior(input_ids[b, p] | input_ids[b, :p]), i.e. it
sits on the token it scores, and `response_mask[b, p]` is 1 where that token is a response token.
A causal LM predicts token p from the logits at position p - 1, so the learner computes

    logp[:, 1:] = log_softmax(logits[:, :-1]).gather(-1, input_ids[:, 1:, None]).squeeze(-1)

and compares it with `behavior_logprobs[:, 1:]` under `response_mask[:, 1:]`. Prompts are never
empty (RolloutGroup enforces it), so position 0 is always a prompt token and the shift loses no
response token.

Rollout routing (schema v2, for `routing_replay: rollout`): `routed_experts[:, b, p]` holds the
top-k experts the generator's MoE layers routed input token p of row b to, in the layout of
`learner.runtime.moe.hooks.RoutingRecord.indices`. The generator ran a forward on every position
but the last real token (never fed back) and the padding; those positions hold experts 0..k-1, a
valid set that changes no scored logprob: a causal forward's output at p never depends on later
positions, and the last real token's own output predicts nothing that is scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from buffer.rollout_group import RolloutGroup


@dataclass(frozen=True)
class RolloutBatch:
    """B = sum of group sizes rows, ordered group by group, then sample by sample."""

    input_ids: torch.Tensor  # (B, L) int64, prompt + response, right-padded with pad_id
    attention_mask: torch.Tensor  # (B, L) int64, 1 on real tokens (prompt or response)
    response_mask: torch.Tensor  # (B, L) float32, 1 where the token at p is a response token
    behavior_logprobs: torch.Tensor  # (B, L) float32, logprob of the token at p; 0 elsewhere
    rewards: torch.Tensor  # (B,) float32
    group_index: torch.Tensor  # (B,) int64, 0..G-1 in the order the groups were given
    prompt_lengths: torch.Tensor  # (B,) int64
    response_lengths: torch.Tensor  # (B,) int64
    policy_versions: torch.Tensor  # (B,) int64, version that sampled the row
    truncated: torch.Tensor  # (B,) bool, finish_reason == "length"
    # (layers, B, L, k) int64, the generator's experts per input position (module docstring);
    # None unless every group carries routing.
    routed_experts: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The batch on `device` (the learner's): `collate` and the rank broadcast build it on
        the CPU. The batch itself when it is there already."""
        if self.input_ids.device == torch.device(device):
            return self
        moved = {
            f.name: None if (value := getattr(self, f.name)) is None else value.to(device)
            for f in fields(self)
        }
        return RolloutBatch(**moved)


def collate(groups: Sequence[RolloutGroup], pad_id: int) -> RolloutBatch:
    """Stack groups into right-padded tensors (see the module docstring for positions).

    Rows are concatenated once into flat buffers and scattered with boolean masks: each row's
    real tokens are a prefix of that row, so the row-major order of True positions in the
    attention mask is exactly the concatenation order of the rows' tokens (likewise for responses).
    The only Python loops run over rows, never over tokens.
    """
    if not groups:
        raise ValueError("collate needs at least one group; the buffer returned an empty batch")
    sizes = np.array([g.num_samples for g in groups], dtype=np.int64)
    prompts = [g.prompt_ids for g in groups]
    prompt_lengths = np.repeat(np.array([len(p) for p in prompts], dtype=np.int64), sizes)
    responses = [r for g in groups for r in g.response_ids]
    response_lengths = np.array([len(r) for r in responses], dtype=np.int64)
    total = prompt_lengths + response_lengths  # (B,)
    width = int(total.max())

    positions = np.arange(width, dtype=np.int64)[None, :]  # (1, L)
    attention = positions < total[:, None]  # (B, L)
    response = positions >= prompt_lengths[:, None]  # (B, L)
    response &= attention

    # Outputs are allocated by torch (torch.empty) and filled through numpy views: torch's CPU
    # allocator keeps reusing memory across calls, while fresh numpy arrays of this size fault in
    # every page again (~2x slower here). numpy does the filling: single-threaded and predictable,
    # where torch's fill/cast would start intra-op threads for tensors this size.
    input_ids, ids = _empty(attention.shape, torch.int64)  # (B, L)
    ids.fill(pad_id)
    # Row b's tokens are prompt(b) then response(b); one concatenate for the whole batch.
    row_prompts = [p for p, n in zip(prompts, sizes, strict=True) for _ in range(n)]
    pieces = [piece for pair in zip(row_prompts, responses, strict=True) for piece in pair]
    ids[attention] = np.concatenate(pieces)
    logprobs, lps = _empty(attention.shape, torch.float32)  # (B, L)
    lps.fill(0.0)
    lps[response] = np.concatenate([lp for g in groups for lp in g.behavior_logprobs])
    attention_mask, view = _empty(attention.shape, torch.int64)
    np.copyto(view, attention)
    response_mask, view = _empty(attention.shape, torch.float32)
    np.copyto(view, response)

    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        behavior_logprobs=logprobs,
        rewards=torch.tensor([r for g in groups for r in g.rewards], dtype=torch.float32),
        group_index=torch.from_numpy(np.repeat(np.arange(len(groups), dtype=np.int64), sizes)),
        prompt_lengths=torch.from_numpy(prompt_lengths),
        response_lengths=torch.from_numpy(response_lengths),
        policy_versions=torch.from_numpy(
            np.repeat(np.array([g.policy_version for g in groups], dtype=np.int64), sizes)
        ),
        truncated=torch.tensor([f == "length" for g in groups for f in g.finish_reasons]),
        routed_experts=_routed_experts(groups, total - 1, width),
    )


def _routed_experts(
    groups: Sequence[RolloutGroup], recorded: np.ndarray, width: int
) -> torch.Tensor | None:
    """(layers, B, L, k) int64 routing of the batch, or None when any group lacks routing.

    `recorded` (B,) = P + R - 1 positions per row, a prefix of each row, so one boolean scatter
    of the concatenated per-sample arrays fills them in row-major order (as for the tokens).
    """
    if any(g.routed_experts is None for g in groups):
        return None
    shapes = sorted({g.routing_shape for g in groups})
    if len(shapes) != 1:
        raise ValueError(
            f"groups route with different (layers, top_k) {shapes}: they were generated by "
            "different models; a batch must come from one policy architecture"
        )
    layers, top_k = shapes[0]
    positions = np.arange(width, dtype=np.int64)[None, :]  # (1, L)
    filled = positions < recorded[:, None]  # (B, L)
    out, view = _empty((layers, len(recorded), width, top_k), torch.int64)  # (layers, B, L, k)
    view[...] = np.arange(top_k, dtype=np.int64)  # experts 0..k-1 where nothing was recorded
    rows = np.concatenate([a for g in groups for a in g.routed_experts])  # (N, layers, k)
    view[:, filled] = rows.transpose(1, 0, 2)  # (layers, N, k)
    return out


def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, np.ndarray]:
    """An uninitialised tensor and a numpy view sharing its memory."""
    tensor = torch.empty(shape, dtype=dtype)
    return tensor, tensor.numpy()
