"""The two baselines of benchmarks/buffer_bench.py, and the meter both sides are timed with.

raw: the group's payload columns encoded by pyarrow, pipelined XADD, XREADGROUP, decoded back
to numpy, XACK; pickle: the group as Python lists through pickle, tensors built row by row.
Pickle appears only here, as a baseline: nothing the harness reads is ever unpickled.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable

import numpy as np
import pyarrow
import redis
import torch

from buffer.rollout_group import RolloutGroup

PAD_ID = 0


class Meter:
    """Wall time and CPU time (this process + the Redis server) of the block it wraps.

    CPU time is the robust figure on a shared machine: wall time also counts waiting for a core.
    """

    def __init__(self, client: redis.Redis):
        self._client = client
        self.wall_s = self.cpu_s = 0.0

    def _redis_cpu(self) -> float:
        info = self._client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def __enter__(self) -> Meter:
        self._start = (time.perf_counter(), time.process_time(), self._redis_cpu())
        return self

    def __exit__(self, *exc: object) -> None:
        wall, cpu, redis_cpu = self._start
        self.wall_s = time.perf_counter() - wall
        self.cpu_s = time.process_time() - cpu + self._redis_cpu() - redis_cpu


def run_raw(client: redis.Redis, stream: str, groups: list[RolloutGroup], batch: int) -> Meter:
    return _metered(client, stream, lambda: _raw_loop(client, stream, groups, batch))


def _metered(client: redis.Redis, stream: str, loop: Callable[[], None]) -> Meter:
    """Time one baseline's loop on a fresh `stream` (consumer group `g`), deleted afterwards."""
    client.xgroup_create(stream, "g", id="0", mkstream=True)
    with Meter(client) as meter:
        loop()
    client.delete(stream)
    return meter


RAW_SCHEMA = pyarrow.schema(
    [
        ("prompt_ids", pyarrow.list_(pyarrow.int32())),
        ("response_ids", pyarrow.list_(pyarrow.int32())),
        ("behavior_logprobs", pyarrow.list_(pyarrow.float32())),
        ("reward", pyarrow.float32()),
    ]
)


def _list_column(rows: list[np.ndarray]) -> pyarrow.ListArray:
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    return pyarrow.ListArray.from_arrays(
        pyarrow.array(offsets), pyarrow.array(np.concatenate(rows))
    )


def numpy_to_arrow(group: RolloutGroup) -> bytes:
    """The raw baseline's encode: the payload columns, one row per sample, as pyarrow builds
    them from numpy arrays (no group-level fields, no checks)."""
    n = group.num_samples
    columns = [
        _list_column([group.prompt_ids] * n),
        _list_column(group.response_ids),
        _list_column(group.behavior_logprobs),
        pyarrow.array(np.asarray(group.rewards, dtype=np.float32)),
    ]
    batch = pyarrow.RecordBatch.from_arrays(columns, schema=RAW_SCHEMA)
    sink = pyarrow.BufferOutputStream()
    with pyarrow.ipc.new_stream(sink, RAW_SCHEMA) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _raw_loop(client: redis.Redis, stream: str, groups: list[RolloutGroup], batch: int) -> None:
    for k in range(len(groups) // batch):
        with client.pipeline(transaction=False) as pipe:
            for i, group in enumerate(groups[k * batch : (k + 1) * batch]):
                data = numpy_to_arrow(group)
                fields = {"data": data, "policy_version": 0, "batch_index": k,
                          "group_id": f"g{k}-{i}", "producer": "bench"}  # fmt: skip
                pipe.xadd(stream, fields)
            pipe.execute()
        reply = client.xreadgroup("g", "bench", {stream: ">"}, count=batch, block=30_000)
        entries = reply[0][1]
        assert len(entries) == batch
        arrays = [arrow_to_numpy(fields[b"data"]) for _, fields in entries]
        assert all(len(a["reward"]) == len(arrays[0]["reward"]) for a in arrays)
        client.xack(stream, "g", *[entry_id for entry_id, _ in entries])


def arrow_to_numpy(data: bytes) -> dict[str, np.ndarray]:
    """The raw baseline's decode: read the Arrow message, take the payload columns as numpy
    (list columns as flat values + offsets, zero-copy), and nothing else: no checks."""
    batch = pyarrow.ipc.open_stream(data).read_next_batch()
    out: dict[str, np.ndarray] = {}
    for name in ("prompt_ids", "response_ids", "behavior_logprobs"):
        column = batch.column(name)
        out[name] = column.values.to_numpy(zero_copy_only=True)
        out[f"{name}_offsets"] = column.offsets.to_numpy(zero_copy_only=True)
    out["reward"] = batch.column("reward").to_numpy(zero_copy_only=True)
    return out


def as_lists(group: RolloutGroup) -> dict[str, object]:
    """The group as a generator holding Python lists would pickle it."""
    return {
        "group_id": group.group_id,
        "prompt_ids": group.prompt_ids.tolist(),
        "response_ids": [r.tolist() for r in group.response_ids],
        "behavior_logprobs": [lp.tolist() for lp in group.behavior_logprobs],
        "rewards": list(group.rewards),
        "finish_reasons": list(group.finish_reasons),
        "policy_version": group.policy_version,
    }


def tensors_from_lists(groups: list[dict]) -> dict[str, torch.Tensor]:
    """The padded tensors collate() builds, the usual way from lists: one row at a time."""
    rows = [(g["prompt_ids"], r, lp) for g in groups
            for r, lp in zip(g["response_ids"], g["behavior_logprobs"], strict=True)]  # fmt: skip
    width = max(len(p) + len(r) for p, r, _ in rows)
    input_ids = torch.full((len(rows), width), PAD_ID, dtype=torch.int64)
    attention = torch.zeros((len(rows), width), dtype=torch.int64)
    response_mask = torch.zeros((len(rows), width), dtype=torch.float32)
    logprobs = torch.zeros((len(rows), width), dtype=torch.float32)
    for b, (prompt, response, lps) in enumerate(rows):
        p, n = len(prompt), len(response)
        input_ids[b, : p + n] = torch.tensor(prompt + response)
        attention[b, : p + n] = 1
        response_mask[b, p : p + n] = 1
        logprobs[b, p : p + n] = torch.tensor(lps)
    rewards = torch.tensor([r for g in groups for r in g["rewards"]], dtype=torch.float32)
    return {"input_ids": input_ids, "attention_mask": attention, "response_mask": response_mask,
            "behavior_logprobs": logprobs, "rewards": rewards}  # fmt: skip


def run_pickle(client: redis.Redis, stream: str, lists: list[dict], batch: int) -> Meter:
    return _metered(client, stream, lambda: _pickle_loop(client, stream, lists, batch))


def _pickle_loop(client: redis.Redis, stream: str, lists: list[dict], batch: int) -> None:
    for k in range(len(lists) // batch):
        with client.pipeline(transaction=False) as pipe:
            for group in lists[k * batch : (k + 1) * batch]:
                pipe.xadd(stream, {"data": pickle.dumps(group, protocol=pickle.HIGHEST_PROTOCOL)})
            pipe.execute()
        reply = client.xreadgroup("g", "bench", {stream: ">"}, count=batch, block=30_000)
        entries = reply[0][1]
        loaded = [pickle.loads(fields[b"data"]) for _, fields in entries]  # baseline only
        tensors = tensors_from_lists(loaded)
        assert tensors["input_ids"].shape[0] == sum(len(g["response_ids"]) for g in loaded)
        client.xack(stream, "g", *[entry_id for entry_id, _ in entries])
