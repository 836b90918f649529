"""Partial rollouts on the vLLM engine (`staleness.partial_rollouts`): stop the in-flight
responses at a token boundary, load the newer version, resubmit prompt + tokens so far.

How a newer version reaches responses that are already decoding, and why this way. vLLM 0.32's
engine can pause its scheduler (`EngineCore.pause_scheduler`, behind `AsyncLLM.
pause_generation`): mode `keep` freezes the requests and resumes them on new weights with their
KV cache, which was computed by the old weights; the next tokens would then be sampled from
neither version's distribution, and their behaviour log-probs would not be what the learner
computes for that version (the rollout contract, design section 4). Mode `abort` drops them,
which is what this module does by hand, per request: every `updates.check_tokens` decoded tokens
it asks for a newer version; on one it aborts the unfinished requests, keeps the tokens and
log-probs they produced, reloads the engine's weights (which resets the prefix cache) and
resubmits each response as a new request whose prompt is the original prompt plus its tokens so
far. The engine prefills that under the new weights, so every later token is sampled, and its
log-prob taken, under exactly the new version, as in the torch generator (which re-runs the new
version over every position so far).

Random numbers. A request's sampler is seeded per request (`SamplingParams.seed`), so a
resubmitted response gets a seed of its own, derived from its sample seed and how many times it
was resubmitted (`segment_seed`): segment 0 uses the sample seed itself, so a call in which no
version arrives samples exactly what `VLLMGenerator.generate` samples without updates. Whether a
version arrives mid-call depends on timing, as in every partial-rollout system: bounded mode
only, never fixed (the config refuses it).

Requests are added to the engine directly with `RequestOutputKind.DELTA` (`LLM.enqueue` forces
final-only outputs, and an aborted request's tokens would be lost): each engine step returns the
tokens and log-probs each request sampled in it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from harness.generators.base import (
    Deadline,
    FinishReason,
    GenRequest,
    GenResult,
    Sample,
    WeightUpdates,
    group_samples,
)


class PartialEngine(Protocol):
    """What a partial rollout drives of `VLLMGenerator`: its engine's request queue and step,
    the weight reload, and the settings a submission needs. A protocol, so this module stays
    below the generator that calls it (no import circle)."""

    @property
    def version(self) -> int: ...
    @property
    def eos(self) -> int: ...
    @property
    def timeout_s(self) -> float: ...

    def sampling_params(self, *, seed: int, max_tokens: int) -> Any: ...
    def check_context(self, rows: Sequence[tuple[list[int], int]]) -> None: ...
    def add_request(self, request_id: str, prompt_ids: list[int], params: Any) -> str: ...
    def engine_step(self) -> list[Any]: ...
    def abort(self, request_ids: list[str]) -> None: ...
    def load_weights(self, version: int, location: str) -> float: ...


_REQUEST_IDS = itertools.count()


def segment_seed(seed: int, segment: int) -> int:
    """The sampler seed of a response's `segment`-th submission: the sample seed for the first,
    then a counter-based derivation (a pure function of both, below 2**63)."""
    if segment == 0:
        return seed
    state = np.random.SeedSequence([seed % 2**64, segment]).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))


@dataclass
class _Response:
    """One sample being decoded: its prompt, what it sampled so far and under which versions."""

    prompt_ids: list[int]
    seed: int
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    reason: FinishReason | None = None
    segments: int = 0

    @property
    def left(self) -> int:
        return self.max_new_tokens - len(self.tokens)

    def sample(self) -> Sample:
        assert self.reason is not None
        return self.tokens, self.logprobs, self.reason


def generate_partial(
    generator: PartialEngine, requests: Sequence[GenRequest], updates: WeightUpdates
) -> list[GenResult]:
    """`VLLMGenerator.generate` with newer versions loaded between tokens (module docstring)."""
    responses = [
        _Response(list(request.prompt_ids), seed, request.max_new_tokens)
        for request in requests
        for seed in request.seeds
    ]
    generator.check_context([(r.prompt_ids, r.max_new_tokens) for r in responses])
    deadline = Deadline(generator.timeout_s, "VLLMGenerator.generate (partial rollout)")
    next_check = updates.check_tokens
    while pending := [r for r in responses if r.reason is None]:
        version = generator.version
        running = dict(_submit(generator, r) for r in pending)  # its outputs' id -> response
        engine_ids = {key: engine_id for key, (_, engine_id) in running.items()}
        switch = None
        try:
            while running and switch is None:
                deadline.check()
                for output in generator.engine_step():
                    response, _ = running[output.request_id]
                    if _absorb(response, output.outputs[0], version, generator.eos):
                        del running[output.request_id]
                decoded = max((len(r.tokens) for r, _ in running.values()), default=0)
                if running and decoded >= next_check:
                    while next_check <= decoded:
                        next_check += updates.check_tokens
                    switch = updates.newer(version)
        except BaseException:
            generator.abort([engine_ids[key] for key in running])
            raise
        if switch is not None:  # their tokens so far are kept, and resubmitted next round
            generator.abort([engine_ids[key] for key in running])
            updates.switched(switch[0], generator.load_weights(*switch))
    return group_samples(
        requests, [r.sample() for r in responses], None, [r.versions for r in responses]
    )


def _submit(generator: PartialEngine, response: _Response) -> tuple[str, tuple[_Response, str]]:
    """Add the response's next segment to the engine: (the id its outputs carry, (the
    response, the engine's internal id, which an abort takes))."""
    params = generator.sampling_params(
        seed=segment_seed(response.seed, response.segments), max_tokens=response.left
    )
    from vllm.sampling_params import RequestOutputKind

    params.output_kind = RequestOutputKind.DELTA
    response.segments += 1
    key = f"partial-{next(_REQUEST_IDS)}"
    return key, (
        response,
        generator.add_request(key, response.prompt_ids + response.tokens, params),
    )


def _absorb(response: _Response, completion: Any, version: int, eos: int) -> bool:
    """Append one step's new tokens of a response (sampled under `version`); True once it
    finished (EOS or its token budget)."""
    ids = list(completion.token_ids)
    logprobs = list(completion.logprobs.logprobs) if completion.logprobs is not None else []
    if len(logprobs) != len(ids):
        raise RuntimeError(
            f"vLLM returned {len(logprobs)} logprobs for {len(ids)} new tokens; partial rollouts "
            "need logprobs=0 and flat_logprobs=True (one logprob per sampled token)"
        )
    response.tokens += ids
    response.logprobs += logprobs
    response.versions += [version] * len(ids)
    reason = completion.finish_reason
    if reason is None:
        return False
    if reason not in ("stop", "length") or (reason == "stop" and response.tokens[-1:] != [eos]):
        raise RuntimeError(
            f"vLLM finished a request with reason {reason!r} and last token "
            f"{response.tokens[-1:]}; expected 'length', or 'stop' at EOS {eos}"
        )
    response.reason = reason
    return True
