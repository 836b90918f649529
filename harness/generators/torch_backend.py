"""The torch reference generator: a Hugging Face forward with a KV cache and our own sampler.

Slower than vLLM on anything but tiny models, but every step is visible: temperature, top-k, top-p
(`learner.algorithms.sampling_dist`, the distribution the learner scores under), and one
`torch.Generator` per sample seeded by its `sample_seed`, so a sample's random numbers never depend
on what else is in the batch. On CPU in float32 two runs with the same seeds give bitwise identical
tokens and logprobs.

On an MoE model `generate` also records the experts every MoE layer routed each position to (the
router hooks of `learner.scoring.capture_routing`, around every forward: the prefill and each
decode step), cut per row to [P + R - 1, layers, top_k] (`GenResult.routed_experts`): what the
learner replays under `routing_replay: rollout` (R3, Ma et al. 2025, arXiv:2510.11370).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from buffer.weight_store import read_state_dict
from harness.generators.base import (
    GENERATE_TIMEOUT_S,
    Deadline,
    GenRequest,
    GenResult,
    Sample,
    SamplingSettings,
    WeightUpdates,
    group_samples,
    set_torch_threads,
)
from learner.algorithms.sampling_dist import processed_logprobs
from learner.scoring import capture_routing, router_modules

# Rows (samples) decoded together; bounds the KV cache of one batch.
DEFAULT_MAX_BATCH_ROWS = 256

# (logits (B, V), active (B,)) -> (tokens (B,), token logprobs (B,))
Chooser = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class _Row:
    """One sample to decode: its prompt, seed (None for greedy) and token budget."""

    prompt_ids: list[int]
    seed: int | None
    max_new_tokens: int


ChooserFactory = Callable[[list[_Row]], Chooser]


class TorchGenerator:
    """`Generator` backed by transformers' model forward and a hand-written decode loop."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        sampling: SamplingSettings,
        eos_token_id: int,
        pad_token_id: int,
        threads: int,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
        timeout_s: float = GENERATE_TIMEOUT_S,
    ) -> None:
        if device == "cpu":
            set_torch_threads(threads)
        self._model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=dtype, local_files_only=True
        ).to(device)
        self._model.eval()
        self._device = torch.device(device)
        self.sampling = sampling
        self._eos = eos_token_id
        self._pad = pad_token_id
        self._max_len = int(self._model.config.max_position_embeddings)
        self._max_batch_rows = max_batch_rows
        self._timeout_s = timeout_s
        self._version = 0
        self._records_routing = _check_routers(self._model)
        # Rollouts: which prompts share a call depends on timing, so each is decoded alone.
        self._batch_requests = False

    @classmethod
    def around(
        cls,
        model: torch.nn.Module,
        *,
        sampling: SamplingSettings,
        eos_token_id: int,
        pad_token_id: int,
        max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
        timeout_s: float = GENERATE_TIMEOUT_S,
    ) -> TorchGenerator:
        """A generator over an already-loaded model, used as it is (no copy, no thread change).

        Why: the learner's sampled evals draw from its current policy with the rollouts' exact
        sampler (per-sample seeds, `learner.algorithms.sampling_dist`). Routing is never recorded.
        An eval's prompts are a fixed list, so its requests are decoded together (one batch, not
        one per prompt: 256 prompts would take 256 decode loops).
        """
        generator = cls.__new__(cls)
        generator._model = model
        generator._device = next(model.parameters()).device
        generator.sampling = sampling
        generator._eos = eos_token_id
        generator._pad = pad_token_id
        generator._max_len = int(model.config.max_position_embeddings)
        generator._max_batch_rows = max_batch_rows
        generator._timeout_s = timeout_s
        generator._version = 0
        generator._records_routing = False
        generator._batch_requests = True
        return generator

    @property
    def version(self) -> int:
        return self._version

    @property
    def model(self) -> torch.nn.Module:
        """The causal LM it decodes with: the generator's evals score it as it is."""
        return self._model

    def generate(
        self, requests: Sequence[GenRequest], updates: WeightUpdates | None = None
    ) -> list[GenResult]:
        """A rollout generator decodes each request (a prompt's group) as a batch of its own: a
        float32 forward's rounding depends on the batch's shape (rows, padded width), and which
        prompts share a call depends on timing (ticket claims, extra rounds, a resume
        regenerating part of a batch), so a sample's logprobs must not depend on its neighbours
        for fixed mode to stay bitwise reproducible. An eval's generator (`around`) decodes its
        fixed list of requests together.

        With `updates` (a partial rollout) the decode loop asks for newer weights every
        `updates.check_tokens` tokens; on one it loads them in place, runs the new version over
        every row's prompt and tokens so far (the KV cache of the old weights is dropped) and
        goes on sampling the same responses: each token's behaviour log-prob is under the
        version that sampled it, which `GenResult.token_versions` records."""
        per_request = [
            [_Row(list(r.prompt_ids), seed, r.max_new_tokens) for seed in r.seeds] for r in requests
        ]
        batches = (
            [[row for rows in per_request for row in rows]] if self._batch_requests else per_request
        )
        decoded, routing, versions = self._decode_all(
            batches,
            self._seeded_sampler,
            "TorchGenerator.generate",
            self._records_routing,
            updates,
        )
        return group_samples(requests, decoded, routing, versions if updates else None)

    def greedy(self, prompts_ids: Sequence[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy decoding of every prompt, batched together: evals call it with a fixed list."""
        rows = [_Row(list(ids), None, max_new_tokens) for ids in prompts_ids]
        decoded, _, _ = self._decode_all([rows], lambda _: _argmax, "TorchGenerator.greedy", False)
        return [ids for ids, _, _ in decoded]

    @torch.no_grad()
    def load_weights(self, version: int, location: str) -> float:
        """Copy the version's tensors into the model's parameters in place (no re-allocation)."""
        started = time.perf_counter()
        state = _state_in_model_layout(location, self._model)
        missing, unexpected = self._model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if self._model.config.tie_word_embeddings else set()
        if unexpected or set(missing) - tied:
            raise ValueError(
                f"weights in {location} do not fit the model: missing {sorted(missing)}, "
                f"unexpected {sorted(unexpected)}; was it written from the same architecture?"
            )
        self._version = version
        return time.perf_counter() - started

    def close(self) -> None:
        del self._model

    def _decode_all(
        self,
        batches: list[list[_Row]],
        make_chooser: ChooserFactory,
        what: str,
        record: bool,
        updates: WeightUpdates | None = None,
    ) -> tuple[list[Sample], list[np.ndarray] | None, list[list[int]]]:
        """Samples of every row, batch after batch (each in chunks of at most max_batch_rows),
        each row's routed experts when `record` (else None) and each row's per-token versions;
        one deadline for them all."""
        rows = [row for batch in batches for row in batch]
        for row in rows:
            if len(row.prompt_ids) + row.max_new_tokens > self._max_len:
                raise ValueError(
                    f"prompt of {len(row.prompt_ids)} tokens + max_new_tokens="
                    f"{row.max_new_tokens} exceeds the model context {self._max_len}; shorten the "
                    "prompt or lower generation.max_new_tokens"
                )
        deadline = Deadline(self._timeout_s, what)
        out: list[Sample] = []
        routing: list[np.ndarray] = []
        versions: list[list[int]] = []
        chunks = [
            batch[start : start + self._max_batch_rows]
            for batch in batches
            for start in range(0, len(batch), self._max_batch_rows)
        ]
        for chunk in chunks:
            trace: list[torch.Tensor] | None = [] if record else None
            samples, step_versions = self._decode(chunk, make_chooser, deadline, trace, updates)
            out += samples
            versions += [step_versions[: len(ids)] for ids, _, _ in samples]
            if trace is not None:
                prompts = [len(row.prompt_ids) for row in chunk]
                width = max(prompts)
                lengths = [len(ids) for ids, _, _ in samples]
                routing += _cut_routing(trace, prompts, lengths, width)
        return out, routing if record else None, versions

    @torch.no_grad()
    def _decode(
        self,
        rows: list[_Row],
        make_chooser: ChooserFactory,
        deadline: Deadline,
        trace: list[torch.Tensor] | None,
        updates: WeightUpdates | None = None,
    ) -> tuple[list[Sample], list[int]]:
        """Decode one batch: left-padded prefill, then one token per row per step; returns the
        samples and the version each step's tokens were sampled with.

        With `trace`, each forward appends its experts (layers, B, T, k): the prefill's T is the
        padded prompt width, each decode step's 1 (see `_cut_routing`). A switch of weights
        (`updates`) replaces the trace by the new version's prefill of every position so far.
        """
        choose = make_chooser(rows)
        batch = len(rows)
        width = max(len(row.prompt_ids) for row in rows)
        input_ids = torch.full((batch, width), self._pad, dtype=torch.long)  # (B, L)
        mask = torch.zeros((batch, width), dtype=torch.long)  # (B, L)
        for i, row in enumerate(rows):
            input_ids[i, width - len(row.prompt_ids) :] = torch.tensor(row.prompt_ids)
            mask[i, width - len(row.prompt_ids) :] = 1
        input_ids, mask = input_ids.to(self._device), mask.to(self._device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, L): 0 at each row's first token
        limits = torch.tensor([row.max_new_tokens for row in rows], device=self._device)
        cache = DynamicCache(config=self._model.config)
        logits = self._forward(input_ids, mask, positions, cache, trace)  # (B, V)
        active = torch.ones(batch, dtype=torch.bool, device=self._device)
        lengths = torch.zeros(batch, dtype=torch.long, device=self._device)
        stopped = torch.zeros(batch, dtype=torch.bool, device=self._device)
        tokens_per_step, logprobs_per_step, step_versions = [], [], []
        for step in range(int(limits.max())):
            deadline.check()
            if updates is not None and step and step % updates.check_tokens == 0:
                newer = updates.newer(self._version)
                if newer is not None:
                    updates.switched(newer[0], self.load_weights(*newer))
                    ids = torch.cat([input_ids, torch.stack(tokens_per_step, dim=1)], dim=1)
                    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, L + t)
                    cache = DynamicCache(config=self._model.config)
                    if trace is not None:
                        trace.clear()  # the new prefill routes every position so far again
                    logits = self._forward(ids, mask, positions, cache, trace)
            step_versions.append(self._version)
            tokens, logprobs = choose(logits, active)  # (B,), (B,)
            tokens = torch.where(active, tokens, self._pad)
            tokens_per_step.append(tokens)
            logprobs_per_step.append(logprobs)
            lengths += active.long()
            stopped |= active & (tokens == self._eos)
            active &= (tokens != self._eos) & (lengths < limits)
            if not bool(active.any()):
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # (B, L + t + 1)
            positions = positions[:, -1:] + 1  # (B, 1)
            logits = self._forward(tokens[:, None], mask, positions, cache, trace)
        all_tokens = torch.stack(tokens_per_step, dim=1).tolist()  # (B, T)
        all_logprobs = torch.stack(logprobs_per_step, dim=1).tolist()  # (B, T)
        samples: list[Sample] = [
            (
                all_tokens[i][:n],
                all_logprobs[i][:n],
                "stop" if stopped[i] else "length",
            )
            for i, n in enumerate(lengths.tolist())
        ]
        return samples, step_versions

    def _forward(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache,
        trace: list[torch.Tensor] | None,
    ) -> torch.Tensor:
        """Logits of the last position only (B, V), float32, extending `cache` in place; with
        `trace`, appends the forward's routed experts (layers, B, T, k)."""
        with capture_routing(self._model) if trace is not None else nullcontext() as recorder:
            out = self._model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        if trace is not None:
            trace.append(recorder.indices(*input_ids.shape))
        return out.logits[:, -1].float()

    def _seeded_sampler(self, rows: list[_Row]) -> Chooser:
        """Sampling by exponential race: argmax_v p_v / E_v with E_v ~ Exp(1) is a draw from p.

        Each row's noise comes from its own generator, one draw of V numbers per decoded token,
        so the stream a sample consumes depends on its seed and its own length only.
        """
        generators = [
            torch.Generator(device=self._device).manual_seed(int(row.seed)) for row in rows
        ]
        sampling = self.sampling

        def choose(logits: torch.Tensor, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logprobs = processed_logprobs(logits, sampling)  # (B, V), -inf outside top-k/p
            noise = torch.ones_like(logprobs)  # (B, V); finished rows keep 1 and are ignored
            for i in active.nonzero()[:, 0].tolist():
                noise[i].exponential_(generator=generators[i])
            tokens = (logprobs.exp() / noise).argmax(dim=-1)  # (B,)
            return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]

        return choose


def _state_in_model_layout(location: str, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The version's tensors under the model's own parameter names.

    A WeightStore version holds the learner's `state_dict()`, already in the model's layout. A
    directory from `save_pretrained` may not be: transformers 5 stores MoE experts as fused 3-D
    tensors (`mlp.experts.gate_up_proj`) but saves them per expert (`mlp.experts.0.gate_proj`),
    so there the checkpoint is read through `from_pretrained`, which converts the layout.
    """
    state = read_state_dict(location)
    if set(state) <= set(model.state_dict()):
        return state
    loaded = AutoModelForCausalLM.from_pretrained(
        location, dtype=next(model.parameters()).dtype, local_files_only=True
    )
    return loaded.state_dict()


def _check_routers(model: torch.nn.Module) -> bool:
    """True for an MoE model (its routing is recorded); experts must fit the record's int16."""
    routers = router_modules(model)
    too_many = [int(r.weight.shape[0]) for r in routers if r.weight.shape[0] > 2**15]
    if too_many:
        raise ValueError(
            f"an MoE layer has {too_many[0]} experts; rollout records store expert indices as "
            "int16 (at most 32,768 experts)"
        )
    return bool(routers)


def _cut_routing(
    trace: list[torch.Tensor], prompt_lengths: list[int], lengths: list[int], width: int
) -> list[np.ndarray]:
    """Each row's experts [P + R - 1, layers, k] (int16) from one decode batch's forwards.

    The prefill ran the left-padded prompts (width W: row i's prompt in columns W - P_i .. W - 1);
    decode forward j (1-based) fed every row's token j - 1 (a pad once the row had finished). A
    row of R tokens fed tokens 0 .. R - 2, so its positions are columns W - P_i .. W + R - 2 of
    the forwards concatenated in time; its last token was never fed back (or fed after it had
    finished, in a forward kept for other rows, and dropped here). After a switch of weights
    the first forward is the new version's prefill of columns 0 .. W + t - 1, so the columns
    concatenate to the same layout.
    """
    steps = torch.cat(trace, dim=2)  # (layers, B, W + S, k)
    per_row = steps.permute(1, 2, 0, 3).to(torch.int16).cpu().numpy()  # (B, W + S, layers, k)
    return [
        np.ascontiguousarray(per_row[i, width - p : width + n - 1])
        for i, (p, n) in enumerate(zip(prompt_lengths, lengths, strict=True))
    ]


def _argmax(logits: torch.Tensor, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    del active
    return logits.argmax(dim=-1), torch.zeros(logits.shape[0], device=logits.device)
