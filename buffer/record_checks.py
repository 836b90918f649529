"""Checks of a rollout record's fields, on plain arrays: coercions, token and routing arrays,
the message envelope.

Split from the group (`buffer.rollout_group`) and the codec (`buffer.schema`) so each stays
readable: this module is the list of field-level things the learner relies on, each raising
`RecordError` with a message that names the field, so a consumer can dead-letter the message with
that reason and carry on. It knows no RolloutGroup: the group's own invariants, which read the
whole group, live with it in `buffer.rollout_group` and call these.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from buffer.record_types import SCHEMA_VERSION_KEY, ExpertArray, RecordError


def check_token_versions(
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


def check_routing(
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
