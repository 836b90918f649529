"""A rollout group (design section 4): all samples of one prompt draw, checked when built.

`RolloutGroup` and the invariants it holds (`check_group`); how it travels (one Arrow IPC message,
`encode_group` / `decode_group`) is `buffer.schema`, the field-level checks it calls are
`buffer.record_checks`. A group that breaks an invariant is never built: the constructor raises
`RecordError` naming the field, so a consumer can dead-letter the message with that reason.

Token and routing fields are held as numpy arrays (views into the received buffer after a
decode), not as Python lists: materialising ~16k Python ints per group would cost more than the
Redis round trip itself (see benchmarks/buffer_bench.py). The constructor accepts lists and
coerces them.
"""

from __future__ import annotations

import json
import math
from dataclasses import InitVar, dataclass, fields
from datetime import datetime

import numpy as np

from buffer.record_checks import (
    check_payload,
    check_routing,
    check_token_versions,
    int16_experts,
    int32_ids,
)
from buffer.record_types import (
    FINISH_REASONS,
    ExpertArray,
    FinishReason,
    FloatArray,
    IntArray,
    RecordError,
)


@dataclass(frozen=True, eq=False)
class RolloutGroup:
    """All samples of one prompt draw. Checked on construction, so a bad group never exists.

    `prompt_ids` is shared by every sample; the other per-sample fields have one entry per sample
    in sample order. Token fields accept lists and are stored as int32/float32 numpy arrays.
    `generation_started_at` None means `created_at` (a v1 record). `routed_experts`, when given,
    holds per sample the int16 experts [P + R - 1, layers, top_k] the generator routed each
    position to (see the module docstring); None when the generator did not record routing.
    `token_versions` holds per sample the policy version of every response token; None means
    every token at `policy_version` (a whole-response generation, or a v1/v2 record), and a list
    of only that is stored as None; `versions_per_token()` gives the arrays either way.
    """

    run_id: str
    group_id: str
    prompt_index: int
    prompt_ids: IntArray
    response_ids: list[IntArray]
    behavior_logprobs: list[FloatArray]
    rewards: list[float]
    reward_infos: list[str]
    finish_reasons: list[FinishReason]
    policy_version: int
    generator_id: str
    created_at: datetime
    generation_started_at: datetime | None = None
    routed_experts: list[ExpertArray] | None = None
    token_versions: list[IntArray] | None = None
    # decode_group only: it checked token ids and logprobs on the message's flat columns, one
    # numpy pass each, so the per-sample passes of check_group are skipped (same checks).
    payload_checked: InitVar[bool] = False

    def __post_init__(self, payload_checked: bool) -> None:
        try:
            prompt = int32_ids(self.prompt_ids)
            responses = [int32_ids(r) for r in self.response_ids]
            logprobs = [np.asarray(lp, dtype=np.float32) for lp in self.behavior_logprobs]
            rewards = [float(r) for r in self.rewards]
            routed = (
                None
                if self.routed_experts is None
                else [int16_experts(a) for a in self.routed_experts]
            )
            versions = (
                None if self.token_versions is None else [int32_ids(v) for v in self.token_versions]
            )
        except (TypeError, ValueError, OverflowError) as exc:
            raise RecordError(
                f"group {self.group_id!r}: tokens must be int32 ids, routed_experts int16 expert "
                f"indices, logprobs and rewards floats ({exc})"
            ) from None
        coerce = object.__setattr__  # frozen dataclass: coerce once, here, then never again
        coerce(self, "prompt_ids", prompt)
        coerce(self, "response_ids", responses)
        coerce(self, "behavior_logprobs", logprobs)
        coerce(self, "rewards", rewards)
        coerce(self, "reward_infos", list(self.reward_infos))
        coerce(self, "finish_reasons", list(self.finish_reasons))
        coerce(self, "routed_experts", routed)
        # Every token at policy_version is stored as None, so a group copied with another
        # policy_version (dataclasses.replace) does not carry versions of the old one.
        if versions is not None and all((v == self.policy_version).all() for v in versions):
            versions = None
        coerce(self, "token_versions", versions)
        if self.generation_started_at is None:
            coerce(self, "generation_started_at", self.created_at)
        check_group(self, payload_checked=payload_checked)

    @property
    def num_samples(self) -> int:
        """G, the number of sampled responses in this group."""
        return len(self.response_ids)

    def versions_per_token(self) -> list[IntArray]:
        """Per sample, the policy version of each response token."""
        if self.token_versions is not None:
            return self.token_versions
        return [np.full(len(r), self.policy_version, dtype=np.int32) for r in self.response_ids]

    @property
    def newest_token_version(self) -> int:
        """The newest version that sampled a token of the group (policy_version unless a
        generator loaded new weights mid-response)."""
        if self.token_versions is None:
            return self.policy_version
        return max((int(v[-1]) for v in self.token_versions if v.size), default=0)

    @property
    def routing_shape(self) -> tuple[int, int]:
        """(layers, top_k) of `routed_experts`; (0, 0) without routing."""
        if self.routed_experts is None:
            return 0, 0
        _, layers, top_k = self.routed_experts[0].shape
        return layers, top_k

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RolloutGroup):
            return NotImplemented
        return all(
            _field_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable numpy payload: not hashable


def _field_equal(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, list) and a and isinstance(a[0], np.ndarray):
        return (
            isinstance(b, list)
            and len(a) == len(b)
            and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return a == b


def check_group(g: RolloutGroup, *, payload_checked: bool = False) -> None:
    """Every invariant the learner relies on; raises RecordError naming the first violation.

    `payload_checked`: `check_payload` already ran on the group's flat token and logprob arrays
    (decode_group has them as one array each), so those two checks are not repeated per sample.
    """
    where = f"group {g.group_id!r}"
    for name in ("run_id", "group_id", "generator_id"):
        if not isinstance(getattr(g, name), str) or not getattr(g, name):
            raise RecordError(f"{where}: {name} must be a non-empty string")
    if g.prompt_index < 0 or g.policy_version < 0:
        raise RecordError(
            f"{where}: prompt_index={g.prompt_index} and policy_version={g.policy_version} "
            "must be >= 0"
        )
    n = len(g.response_ids)
    if n == 0:
        raise RecordError(f"{where} is empty: a group needs at least one sampled response")
    per_sample = {
        "behavior_logprobs": g.behavior_logprobs,
        "rewards": g.rewards,
        "reward_infos": g.reward_infos,
        "finish_reasons": g.finish_reasons,
        "routed_experts": g.routed_experts if g.routed_experts is not None else [None] * n,
    }
    for name, values in per_sample.items():
        if len(values) != n:
            raise RecordError(f"{where}: {len(values)} {name} for {n} responses; give one each")
    if g.prompt_ids.ndim != 1 or g.prompt_ids.size == 0:
        raise RecordError(f"{where}: prompt_ids must be a non-empty 1-D token list")
    if any(a.ndim != 1 for a in (*g.response_ids, *g.behavior_logprobs)):
        raise RecordError(f"{where}: each response and its logprobs must be a 1-D list")
    lengths = [len(r) for r in g.response_ids]
    lp_lengths = [len(lp) for lp in g.behavior_logprobs]
    if lengths != lp_lengths:
        raise RecordError(
            f"{where}: response_ids lengths {lengths} != behavior_logprobs lengths {lp_lengths}; "
            "the generator must emit exactly one logprob per response token"
        )
    if not payload_checked:
        check_payload(
            g.prompt_ids,
            np.concatenate(g.response_ids),
            np.concatenate(g.behavior_logprobs),
            where,
        )
    if not all(math.isfinite(r) for r in g.rewards):
        raise RecordError(f"{where}: non-finite reward in {g.rewards}")
    bad = sorted(set(g.finish_reasons) - FINISH_REASONS)
    if bad:
        raise RecordError(f"{where}: finish_reason {bad} is not one of {sorted(FINISH_REASONS)}")
    for info in set(g.reward_infos):
        try:
            json.loads(info)
        except (TypeError, ValueError) as exc:
            raise RecordError(f"{where}: reward_info {info!r:.80} is not JSON ({exc})") from None
    _check_times(g, where)
    if g.routed_experts is not None:
        check_routing(g.routed_experts, len(g.prompt_ids), lengths, where)
    if g.token_versions is not None:
        check_token_versions(g.token_versions, g.policy_version, lengths, where)


def _check_times(g: RolloutGroup, where: str) -> None:
    """Aware timestamps, generation start no later than creation: staleness accounting measures
    generation time between the two, and a naive one would shift by the host's UTC offset."""
    for name in ("created_at", "generation_started_at"):
        moment = getattr(g, name)
        if not isinstance(moment, datetime) or moment.tzinfo is None:
            raise RecordError(f"{where}: {name} must be timezone-aware (use datetime.now(UTC))")
    if g.generation_started_at > g.created_at:  # type: ignore[operator]  # set in __post_init__
        raise RecordError(
            f"{where}: generation_started_at {g.generation_started_at} is after created_at "
            f"{g.created_at}; take it right before the generate call that made the group"
        )
