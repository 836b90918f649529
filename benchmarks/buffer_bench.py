"""Rollout buffer throughput and memory, side by side with two baselines, on an embedded Redis.

Measured path (per batch of groups): push_many (encode, digest, one pipelined claim script per
group, one MULTI adding them all) -> take_batch (XREADGROUP, decode, checks) -> collate to padded
tensors -> commit (SADD + XACK + XDEL). Baselines on the same server, with the same batching (a
batch's groups pushed in one pipeline), interleaved round by round so machine noise hits all
three alike:
  raw     the group's payload (prompt and response ids, behaviour logprobs, rewards) encoded by
          pyarrow as one record batch (one row per sample, list columns built from the numpy
          arrays), pipelined XADD / XREADGROUP / decoded back to numpy arrays (zero-copy views)
          / XACK: the floor of any Arrow buffer of this shape, with nothing checked;
  pickle  the group as Python lists, pickle.dumps -> pipelined XADD -> XREADGROUP ->
          pickle.loads -> the same padded tensors built row by row -> XACK. Pickle appears only
          here, as a baseline.
Then a memory phase: producer processes push as fast as they can into a buffer with max_depth
while a slow consumer trains; Redis used_memory_peak and the consumer's RSS must stay bounded.

Usage: python benchmarks/buffer_bench.py [--quick]. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pickle
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import psutil
import redis
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.buffer_baselines import PAD_ID, Meter, as_lists, numpy_to_arrow, run_pickle, run_raw
from buffer.collate import collate
from buffer.config import BufferConfig
from buffer.connection import connect
from buffer.consumer import RolloutConsumer
from buffer.outbox import BufferFullError
from buffer.producer import RolloutProducer
from buffer.rollout_group import RolloutGroup
from buffer.schema import encode_group, make_group_id
from buffer.server import EmbeddedRedis


def make_groups(n: int, args: argparse.Namespace, run_id: str, seed: int = 0) -> list[RolloutGroup]:
    """n distinct groups (ids differ) sharing a few random token arrays, like a real batch."""
    rng = np.random.default_rng(seed)
    size, prompt_len, response_len = args.group_size, args.prompt_len, args.response_len
    prompts = [rng.integers(0, 150_000, prompt_len, dtype=np.int32) for _ in range(4)]
    responses = [rng.integers(0, 150_000, response_len, dtype=np.int32) for _ in range(4 * size)]
    logprobs = [-rng.random(response_len, dtype=np.float32) for _ in range(4 * size)]
    now = datetime.now(UTC)
    return [
        RolloutGroup(
            run_id=run_id,
            group_id=make_group_id(seed, i // 8, i),
            prompt_index=i,
            prompt_ids=prompts[i % 4],
            response_ids=[responses[(i + s) % len(responses)] for s in range(size)],
            behavior_logprobs=[logprobs[(i + s) % len(logprobs)] for s in range(size)],
            rewards=[float(s % 2) for s in range(size)],
            reward_infos=['{"correct": 1}'] * size,
            finish_reasons=["stop"] * size,
            policy_version=0,
            generator_id="bench",
            created_at=now,
        )
        for i in range(n)
    ]


# ---- the three variants: each processes `groups` in batches and returns elapsed seconds -------


def run_buffer(client: redis.Redis, run_id: str, groups: list[RolloutGroup], batch: int) -> Meter:
    config = BufferConfig(max_depth=4 * batch)
    producer = RolloutProducer(client, run_id, config)
    consumer = RolloutConsumer(client, run_id, config)
    with Meter(client) as meter:
        _buffer_loop(producer, consumer, groups, batch)
    return meter


def stage_breakdown(client: redis.Redis, args: argparse.Namespace) -> dict[str, float]:
    """Client CPU µs per group of each stage of the buffer path (a separate, unmeasured run)."""
    groups = make_groups(args.groups_per_round, args, "bench-stages", seed=99)
    config = BufferConfig(max_depth=4 * args.batch)
    producer = RolloutProducer(client, "bench-stages", config)
    consumer = RolloutConsumer(client, "bench-stages", config)
    stages: Counter = Counter()
    _buffer_loop(producer, consumer, groups, args.batch, stages)
    client.delete(*client.keys("gspo:bench-stages:*"))
    return {name: round(seconds / len(groups) * 1e6) for name, seconds in stages.items()}


def _buffer_loop(
    producer: RolloutProducer,
    consumer: RolloutConsumer,
    groups: list[RolloutGroup],
    batch: int,
    stages: Counter | None = None,
) -> None:
    """The measured path; `stages` (if given) collects this process's CPU seconds per stage."""
    clock = time.process_time
    stages = Counter() if stages is None else stages
    for k in range(len(groups) // batch):
        chunk = groups[k * batch : (k + 1) * batch]
        t0 = clock()
        for group in chunk:
            encode_group(group)  # timed alone to split push into encode vs digest + Redis
        t1 = clock()
        producer.push_many(chunk, batch_index=k)
        stages["encode"] += t1 - t0
        stages["push_without_encode"] += clock() - t1 - (t1 - t0)
        t0 = clock()
        deliveries = consumer.take_batch(k, batch, consumer="bench", timeout_s=30)
        t1 = clock()
        tensors = collate([d.group for d in deliveries], pad_id=PAD_ID)
        t2 = clock()
        assert tensors.input_ids.shape[0] == batch * groups[0].num_samples
        consumer.commit(deliveries)
        stages["take_and_decode"] += t1 - t0
        stages["collate"] += t2 - t1
        stages["commit"] += clock() - t2


def throughput(args: argparse.Namespace, server: EmbeddedRedis) -> dict[str, object]:
    """Interleaved rounds of the three variants; medians over rounds (round 0 is a warm-up)."""
    with connect(server.url) as client:
        return _throughput(args, client)


def _throughput(args: argparse.Namespace, client: redis.Redis) -> dict[str, object]:
    n = args.groups_per_round
    rates: dict[str, list[float]] = {"buffer": [], "raw": [], "pickle": []}
    cpu_us: dict[str, list[float]] = {"buffer": [], "raw": [], "pickle": []}
    for round_index in range(args.rounds + 1):
        run_id = f"bench-{round_index}"
        groups = make_groups(n, args, run_id, seed=round_index)
        payloads = [encode_group(g) for g in groups]
        lists = [as_lists(g) for g in groups]
        meters = {
            "raw": run_raw(client, f"raw-{round_index}", groups, args.batch),
            "buffer": run_buffer(client, run_id, groups, args.batch),
            "pickle": run_pickle(client, f"pickle-{round_index}", lists, args.batch),
        }
        client.delete(*client.keys(f"gspo:{run_id}:*"))
        if round_index == 0:
            continue
        for name, meter in meters.items():
            rates[name].append(n / meter.wall_s)
            cpu_us[name].append(meter.cpu_s / n * 1e6)
        print(
            f"round {round_index}: "
            + ", ".join(f"{k} {n / m.wall_s:7.1f} groups/s" for k, m in meters.items())
        )
    sizes = {"buffer": len(payloads[0]), "raw": len(numpy_to_arrow(groups[0])),
             "pickle": len(pickle.dumps(lists[0], protocol=pickle.HIGHEST_PROTOCOL))}  # fmt: skip
    rate = {name: statistics.median(values) for name, values in rates.items()}
    cpu = {name: statistics.median(values) for name, values in cpu_us.items()}
    return {
        "groups_per_s": {k: round(v, 1) for k, v in rate.items()},
        "mb_per_s": {k: round(rate[k] * sizes[k] / 1e6, 1) for k in rate},
        "cpu_us_per_group": {k: round(v) for k, v in cpu.items()},
        "message_bytes": sizes,
        # Ratios are medians of per-round ratios: the variants of one round share its noise.
        "buffer_vs_raw": _median_ratio(rates["buffer"], rates["raw"], 3),
        "buffer_vs_pickle": _median_ratio(rates["buffer"], rates["pickle"], 2),
        "buffer_vs_raw_cpu": _median_ratio(cpu_us["raw"], cpu_us["buffer"], 3),
        "buffer_vs_pickle_cpu": _median_ratio(cpu_us["pickle"], cpu_us["buffer"], 2),
        "buffer_client_cpu_us_per_stage": stage_breakdown(client, args),
    }


def _median_ratio(numerators: list[float], denominators: list[float], digits: int) -> float:
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True)]
    return round(statistics.median(ratios), digits)


# ---- memory phase: producers outpace a slow consumer; max_depth must bound memory -------------


def _producer(url: str, run_id: str, args: argparse.Namespace, *, seed: int, ready, stop) -> None:
    config = BufferConfig(max_depth=args.max_depth, push_timeout_s=1.0)
    producer = RolloutProducer(connect(url), run_id, config)
    groups = make_groups(args.memory_groups, args, run_id, seed=seed)
    ready.set()
    for group in groups:
        while not stop.is_set():
            try:
                producer.push(group, batch_index=0)
                break
            except BufferFullError:
                continue  # full is the point of this phase; retry until told to stop
        if stop.is_set():
            return


def memory_bound(args: argparse.Namespace, data_dir: Path) -> dict[str, object]:
    """Producers push as fast as they can; a consumer slower than them trains for a while."""
    context = multiprocessing.get_context("spawn")
    with EmbeddedRedis(data_dir, appendfsync="everysec") as server:
        client = connect(server.url)
        run_id = "bench-memory"
        consumer = RolloutConsumer(client, run_id, BufferConfig(max_depth=args.max_depth))
        stop = context.Event()
        readies = [context.Event() for _ in range(args.producers)]
        producers = [
            context.Process(
                target=_producer,
                args=(server.url, run_id, args),
                kwargs={"seed": 100 + i, "ready": ready, "stop": stop},
            )
            for i, ready in enumerate(readies)
        ]
        for process in producers:
            process.start()
        for ready in readies:
            ready.wait(timeout=120)
        me = psutil.Process()
        rss_start = me.memory_info().rss
        peak_depth, peak_rss, consumed = 0, rss_start, 0
        stop_at = time.monotonic() + args.memory_seconds
        while time.monotonic() < stop_at:
            result = consumer.take(args.batch, 0, 0, consumer="slow", timeout_s=30)
            collate([d.group for d in result.deliveries], pad_id=PAD_ID)
            time.sleep(args.train_seconds)  # the learner is slower than the producers
            peak_depth = max(peak_depth, consumer.depth())
            consumer.commit(result.deliveries)
            consumed += len(result.deliveries)
            peak_rss = max(peak_rss, me.memory_info().rss)
        stop.set()
        for process in producers:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
        group_bytes = len(encode_group(make_groups(1, args, run_id)[0]))
        info = client.info("memory")
        client.close()
    return {
        "max_depth": args.max_depth,
        "peak_depth": peak_depth,
        "groups_consumed": consumed,
        "redis_used_memory_peak_mb": round(info["used_memory_peak"] / 1e6, 1),
        "redis_payload_bound_mb": round(args.max_depth * group_bytes / 1e6, 1),
        "consumer_rss_start_mb": round(rss_start / 1e6, 1),
        "consumer_rss_peak_mb": round(peak_rss / 1e6, 1),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Fewer rounds; under a minute.")
    parser.add_argument("--group-size", type=int, default=8, help="Responses per group.")
    parser.add_argument("--prompt-len", type=int, default=256, help="Prompt tokens.")
    parser.add_argument("--response-len", type=int, default=1024, help="Tokens per response.")
    parser.add_argument("--batch", type=int, default=8, help="Groups per take/collate/commit.")
    parser.add_argument("--rounds", type=int, default=10, help="Measured rounds per variant.")
    parser.add_argument("--groups-per-round", type=int, default=400, help="Groups per round.")
    parser.add_argument("--max-depth", type=int, default=64, help="Memory phase max_depth.")
    parser.add_argument("--producers", type=int, default=2, help="Memory phase producers.")
    parser.add_argument("--memory-seconds", type=float, default=20.0, help="Memory phase length.")
    parser.add_argument("--memory-groups", type=int, default=4000, help="Groups per producer.")
    parser.add_argument("--train-seconds", type=float, default=0.05, help="Consumer sleep/batch.")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.groups_per_round, args.memory_seconds = 8, 80, 8.0
        args.memory_groups = 1000
    return args


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="buffer-bench-") as tmp:
        with EmbeddedRedis(Path(tmp) / "throughput", appendfsync="everysec") as server:
            speed = throughput(args, server)
        memory = memory_bound(args, Path(tmp) / "memory")
    result = {
        "benchmark": "buffer_bench",
        "quick": args.quick,
        "group": {
            "size": args.group_size,
            "prompt_len": args.prompt_len,
            "response_len": args.response_len,
            "batch": args.batch,
        },
        **speed,
        "memory": memory,
        "targets": {
            "buffer_vs_raw>=0.7": speed["buffer_vs_raw"] >= 0.7,
            "buffer_vs_pickle>=6": speed["buffer_vs_pickle"] >= 6.0,
            "client_cpu_us_per_group<=500": sum(speed["buffer_client_cpu_us_per_stage"].values())
            <= 500,
            "redis_memory_bounded": memory["peak_depth"] <= memory["max_depth"],
        },
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
