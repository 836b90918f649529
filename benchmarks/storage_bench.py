"""Trial output in a bucket: our Mirror against raw pyarrow.fs copies, side by side in one run.

The endpoint is moto's S3 server on loopback (the tests' `tests.s3`), so absolute numbers are
moto's (a Python server); the ratios compare client work and request counts on equal footing:
- full push of a trial directory (checkpoint, weight version, metrics parts, ledger) vs
  `pyarrow.fs.copy_files` of the same tree;
- the push a learner does at a checkpoint (one new checkpoint, a few new parts) vs copying the
  whole tree again, which is what a sync without change tracking costs;
- a no-op push (nothing changed: listing only);
- a pull into an empty working copy vs `copy_files` the other way.

Usage: python benchmarks/storage_bench.py [--quick]. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.storage.mirror import Mirror
from harness.storage.remote_tree import RemoteTree
from tests.s3 import start_s3_server


def write_trial(root: Path, weights_mb: int, parts: int, step: int) -> None:
    """A trial directory's shape: one checkpoint, one weight version, metrics and ledger."""
    rng = os.urandom
    (root / f"checkpoints/step-{step:06d}").mkdir(parents=True, exist_ok=True)
    (root / f"checkpoints/step-{step:06d}/state.pt").write_bytes(rng(3 * weights_mb << 20))
    (root / "checkpoints/latest.json").write_text(json.dumps({"step": step}))
    (root / f"weights/v{step:06d}").mkdir(parents=True, exist_ok=True)
    (root / f"weights/v{step:06d}/model.safetensors").write_bytes(rng(weights_mb << 20))
    (root / f"weights/v{step:06d}/config.json").write_text("{}")
    for i in range(parts):
        (root / "metrics.parquet").mkdir(exist_ok=True)
        (root / f"metrics.parquet/part-{step * 100 + i:06d}.parquet").write_bytes(rng(20_000))
        (root / "trained_groups").mkdir(exist_ok=True)
        (root / f"trained_groups/step-{step * 100 + i:06d}.json").write_bytes(rng(800))


def timed(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small files, one repeat")
    args = parser.parse_args(argv)
    weights_mb, parts, repeats = (1, 10, 1) if args.quick else (16, 40, 3)
    scratch = Path(tempfile.mkdtemp(prefix="storage-bench-"))
    server = start_s3_server(scratch / "moto.log")
    try:
        local = scratch / "trial"
        write_trial(local, weights_mb, parts, step=2)
        results: dict[str, float] = {}
        counter = iter(range(10**6))

        def fresh(prefix: str) -> RemoteTree:
            return RemoteTree.open(server.new_bucket(f"{prefix}{next(counter)}"))

        def raw_upload() -> None:
            tree = fresh("raw")
            tree.fs.create_dir(tree.base)
            pafs.copy_files(str(local), tree.base, destination_filesystem=tree.fs)

        results["full_push_s"] = timed(lambda: Mirror(local, fresh("ours")).push([""]), repeats)
        results["raw_copy_files_s"] = timed(raw_upload, repeats)

        tree = fresh("incremental")
        mirror = Mirror(local, tree)
        mirror.push([""])
        results["noop_push_s"] = timed(lambda: mirror.push([""]), repeats)
        write_trial(local, weights_mb, 4, step=4)  # the next checkpoint and a few steps
        start = time.perf_counter()
        uploaded = mirror.push([""])
        results["checkpoint_push_s"] = time.perf_counter() - start
        results["checkpoint_push_files"] = len(uploaded)
        results["raw_recopy_all_s"] = timed(raw_upload, repeats)

        def our_pull() -> None:
            target = scratch / f"pull-{next(counter)}"
            Mirror(target, tree).pull([""])

        def raw_pull() -> None:
            target = scratch / f"raw-pull-{next(counter)}"
            target.mkdir()
            pafs.copy_files(tree.base, str(target), source_filesystem=tree.fs)

        results["pull_s"] = timed(our_pull, repeats)
        results["raw_pull_s"] = timed(raw_pull, repeats)
        ratios = {
            "full_push_vs_raw": results["raw_copy_files_s"] / results["full_push_s"],
            "checkpoint_push_vs_recopy": results["raw_recopy_all_s"] / results["checkpoint_push_s"],
            "pull_vs_raw": results["raw_pull_s"] / results["pull_s"],
        }
        for key, value in results.items():
            print(f"{key:28s} {value:10.4f}")
        print(
            "speed ratios (>1: ours faster): "
            + json.dumps({k: round(v, 3) for k, v in ratios.items()})
        )
        size_mb = sum(p.stat().st_size for p in local.rglob("*") if p.is_file()) / 2**20
        summary = {"tree_mb": round(size_mb, 1), **{k: round(v, 4) for k, v in results.items()}}
        print(
            json.dumps(
                {"storage_bench": summary, "ratios": {k: round(v, 3) for k, v in ratios.items()}}
            )
        )
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
