"""The checks of a rollout record (`buffer.schema`): coercions, group invariants, the envelope.

Split from `buffer.schema` so the record's definition and codec stay readable: this module is
only the list of things the learner relies on, each raising `RecordError` with a message that
names the field, so a consumer can dead-letter the message with that reason and carry on.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from buffer.schema import ExpertArray, RolloutGroup

FINISH_REASONS: frozenset[str] = frozenset({"stop", "length"})
SCHEMA_VERSION_KEY = b"gspo.schema_version"  # Arrow schema metadata naming the record version


class RecordError(ValueError):
    """A rollout record is malformed; the message names the field and what was wrong with it."""


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
        _check_routing(g.routed_experts, len(g.prompt_ids), lengths, where)
    if g.token_versions is not None:
        _check_token_versions(g.token_versions, g.policy_version, lengths, where)


def _check_token_versions(
    versions: list[np.ndarray], policy_version: int, lengths: list[int], where: str
) -> None:
    """One version per response token, non-decreasing along the response (weights only move
    forward mid-response), none older than the version the group started with."""
    version_lengths = [len(v) for v in versions]
    if version_lengths != lengths:
        raise RecordError(
            f"{where}: token_versions lengths {version_lengths} != response_ids lengths "
            f"{lengths}; the generator must give every response token a version"
        )
    for j, v in enumerate(versions):
        if v.ndim != 1:
            raise RecordError(f"{where}: token_versions of sample {j} must be a 1-D list")
        if v.size and int(v.min()) < policy_version:
            raise RecordError(
                f"{where}: sample {j} has a token of version {int(v.min())}, older than the "
                f"group's policy_version {policy_version} (the version it started with)"
            )
        if v.size > 1 and bool((np.diff(v) < 0).any()):
            step = int(np.argmax(np.diff(v) < 0))
            raise RecordError(
                f"{where}: token_versions of sample {j} go backwards ({int(v[step])} then "
                f"{int(v[step + 1])} at token {step + 1}); a generator's weights only move "
                "forward"
            )


def check_payload(
    prompt_ids: np.ndarray, response_ids: np.ndarray, logprobs: np.ndarray, where: str
) -> None:
    """Token ids >= 0 and finite logprobs, on the flat arrays (all responses concatenated)."""
    lowest = min(int(prompt_ids.min()), int(response_ids.min()) if response_ids.size else 0)
    if lowest < 0:
        raise RecordError(f"{where}: negative token id {lowest}")
    if logprobs.size and not np.isfinite(logprobs).all():
        raise RecordError(f"{where}: non-finite behavior logprob (NaN or inf) in a response")


def _check_times(g: RolloutGroup, where: str) -> None:
    for name in ("created_at", "generation_started_at"):
        moment = getattr(g, name)
        if not isinstance(moment, datetime) or moment.tzinfo is None:
            raise RecordError(f"{where}: {name} must be timezone-aware (use datetime.now(UTC))")
    if g.generation_started_at > g.created_at:  # type: ignore[operator]  # set in __post_init__
        raise RecordError(
            f"{where}: generation_started_at {g.generation_started_at} is after created_at "
            f"{g.created_at}; take it right before the generate call that made the group"
        )


def _check_routing(
    routed: list[ExpertArray], prompt_length: int, lengths: list[int], where: str
) -> None:
    """routed_experts: [P + R_j - 1, layers, top_k] per sample, one (layers, top_k), >= 0."""
    shapes = [a.shape for a in routed]
    if any(len(shape) != 3 for shape in shapes):
        raise RecordError(
            f"{where}: routed_experts must be [P + R - 1, layers, top_k] per sample, got shapes "
            f"{shapes}"
        )
    inner = {shape[1:] for shape in shapes}
    if len(inner) != 1 or min(next(iter(inner))) < 1:
        raise RecordError(
            f"{where}: routed_experts (layers, top_k) must be one positive pair for the whole "
            f"group, got {sorted(inner)}"
        )
    rows = [shape[0] for shape in shapes]
    want = [prompt_length + n - 1 for n in lengths]
    if rows != want:
        raise RecordError(
            f"{where}: routed_experts cover {rows} positions, but P + R - 1 = {want} (every "
            "prompt token and every response token but the last)"
        )
    lowest = min((int(a.min()) for a in routed if a.size), default=0)
    if lowest < 0:
        raise RecordError(f"{where}: routed_experts holds a negative expert index {lowest}")


# ---- coercions (constructor) and the message envelope (decode) ----


def int32_ids(values: object) -> np.ndarray:
    """Token ids as int32, refusing what a plain cast would silently wrap or truncate."""
    return _narrow_int(values, np.int32)


def int16_experts(values: object) -> np.ndarray:
    """Expert indices as int16 (up to 32,767 experts), refusing silent wrap-around."""
    return _narrow_int(values, np.int16)


def _narrow_int(values: object, dtype: type[np.integer]) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype == dtype or array.size == 0:
        return array.astype(dtype, copy=False)
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"dtype {array.dtype} is not an integer type")
    if array.max() > np.iinfo(dtype).max:
        raise OverflowError(f"value {array.max()} does not fit {np.dtype(dtype).name}")
    return array.astype(dtype)


def read_single_batch(data: bytes) -> pa.RecordBatch:
    """The one non-empty record batch of a group message."""
    try:
        reader = pa.ipc.open_stream(data)
        batch = next(reader, None)
        extra = next(reader, None)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise RecordError(f"not an Arrow IPC stream ({len(data)} bytes): {exc}") from None
    if batch is None or batch.num_rows == 0:
        raise RecordError("empty group: the message has no rows (a group needs >= 1 sample)")
    if extra is not None:
        raise RecordError("a group message holds exactly one record batch, got more")
    return batch


def check_schema(schema: pa.Schema, want_schema: pa.Schema) -> None:
    """Names and types must match the declared version's schema; nullability is not compared."""
    if schema.equals(want_schema):  # the fast path: every message from encode_group
        return
    got = {f.name: f.type for f in schema}
    want = {f.name: f.type for f in want_schema}
    if schema.names == want_schema.names and got == want:
        return
    missing = sorted(want.keys() - got.keys())
    extra = sorted(got.keys() - want.keys())
    wrong = [f"{k}: {got[k]} (want {want[k]})" for k in want if k in got and got[k] != want[k]]
    version = (want_schema.metadata or {}).get(SCHEMA_VERSION_KEY, b"1").decode()
    raise RecordError(
        f"schema mismatch (version {version}): missing {missing}, unexpected {extra}, wrong "
        f"types {wrong}, order {schema.names}; producers must encode with "
        "buffer.schema.encode_group"
    )
