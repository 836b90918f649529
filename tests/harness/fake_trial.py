"""A tiny stand-in for `harness trial` that honours the trial-runner file contract.

It is a real process run by the real scheduler: it parses the same arguments, writes
`trial.json` (atomically), one metrics part per step through the learner's MetricsLog,
`prompts.parquet` and `resolved_config.yaml`, resumes from its last part with `--resume`, and
exits 0 for completed/diverged, non-zero for failed. Behaviour switches come from env vars:

FAKE_STEP_S        seconds per step (default 0.02)
FAKE_FAIL_ARMS     comma-separated arms that fail after their first step (exit 3)
FAKE_DIVERGE_ARMS  arms that diverge at their second step (exit 0, status diverged)
FAKE_HANG          "1": after step 1, start a grandchild and both sleep until killed
FAKE_LEAK          "1": start a grandchild that outlives the trial (the pool must kill it)
FAKE_ESCAPE        "1": grandchildren start their own session, out of reach of a group kill
                   (as the real runner's components do)
FAKE_LR_SCORES     "1": eval/pass_rate = 0.05 * step * quality(arm's lr in the config)
                   + 0.001 * seed, quality peaking at lr 1e-3 (a tuning stage selects it); the
                   eval set names of the config go to `eval_sets.json` in the trial dir
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from learner.runtime.metrics_log import MetricsLog

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["trial"])
    parser.add_argument("config")
    parser.add_argument("--arm", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--lag", type=int, required=True)
    parser.add_argument("--mode", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("overrides", nargs="*")
    return parser.parse_args(argv)


def prompts(seed: int) -> pa.Table:
    """Same prompts for every arm of a seed (matched arms), different across seeds."""
    rows = [("train", i, f"{seed}+{i}=", str(seed + i)) for i in range(4)]
    rows += [("eval", i, f"{seed}*{i}=", str(seed * i)) for i in range(2)]
    columns = list(zip(*rows, strict=True))
    return pa.table(dict(zip(["split", "index", "prompt", "ground_truth"], columns, strict=True)))


def lr_quality(config: dict, arm: str) -> float:
    """How good the arm's learning rate is, in (0, 1]: 1 at lr 1e-3, less a third per decade
    away (FAKE_LR_SCORES)."""
    settings = next(a for a in config["arms"] if a["name"] == arm)
    lr = float(settings.get("lr", config.get("learner", {}).get("lr", 1e-5)))
    return max(0.05, 1.0 - abs(math.log10(lr) + 3.0) / 3.0)


def arms_from_env(name: str) -> set[str]:
    return {arm for arm in os.environ.get(name, "").split(",") if arm}


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.steps is None:  # like the real runner: learner.steps of the config
        args.steps = int(yaml.safe_load(Path(args.config).read_text())["learner"]["steps"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{args.arm}__seed{args.seed}__lag{args.lag}__{args.mode}"
    with (out / "attempts.jsonl").open("a") as handle:
        handle.write(json.dumps({"pid": os.getpid(), "start": time.time(), "resume": args.resume,
                                 "argv": argv}) + "\n")  # fmt: skip
    info = {
        "experiment": "fake", "trial_name": name, "arm": args.arm, "objective": args.arm,
        "seed": args.seed, "lag": args.lag, "mode": args.mode, "status": "running",
        "diverged": False, "diverged_reason": None, "steps_planned": args.steps,
        "steps_completed": 0, "config_hash": os.environ.get("FAKE_CONFIG_HASH"),
        "initial_weights_digest": "w0", "prompt_set_digest": f"p{args.seed}",
        "started_at": "2026-01-01T00:00:00+00:00", "finished_at": None,
        "provenance": {"git": {"commit": "abc123", "dirty": False}, "packages": {},
                       "hardware": {}},
    }  # fmt: skip
    write_json(out / "trial.json", info)
    pq.write_table(prompts(args.seed), out / "prompts.parquet")
    (out / "resolved_config.yaml").write_text(f"arm: {args.arm}\n")
    log = MetricsLog(out)
    done = log.steps()
    start = (done[-1] + 1) if (args.resume and done) else 1
    if not args.resume:
        log.truncate_after(0)
    step_s = float(os.environ.get("FAKE_STEP_S", "0.02"))
    quality, seed_term = 1.0, 0.0
    if os.environ.get("FAKE_LR_SCORES") == "1":
        seed_term = 0.001 * args.seed
        config = yaml.safe_load(Path(args.config).read_text())
        quality = lr_quality(config, args.arm)
        names = [e["name"] for e in config.get("evals", [])]
        write_json(out / "eval_sets.json", {"eval_sets": names})
    for step in range(start, args.steps + 1):
        time.sleep(step_s)
        diverging = args.arm in arms_from_env("FAKE_DIVERGE_ARMS") and step == 2
        metrics = {
            "reward/mean": 0.1 * step + 0.01 * args.seed,
            "optim/grad_norm": math.inf if diverging else 1.0 / step,
            "eval/pass_rate": (0.05 * step * quality + seed_term if step % 2 == 0 else math.nan),
        }
        log.append(step, 1_700_000_000.0 + step, metrics)
        info["steps_completed"] = step
        write_json(out / "trial.json", info)
        if diverging:
            info |= {"status": "diverged", "diverged": True, "diverged_reason": "grad not finite"}
            write_json(out / "trial.json", info)
            return 0
        if args.arm in arms_from_env("FAKE_FAIL_ARMS"):
            info["status"] = "failed"
            write_json(out / "trial.json", info)
            print(f"{name}: failing on purpose", flush=True)
            return 3
        if os.environ.get("FAKE_HANG") == "1":
            child = subprocess.Popen(
                SLEEPER, start_new_session=os.environ.get("FAKE_ESCAPE") == "1"
            )
            (out / "pids.txt").write_text(f"{os.getpid()} {child.pid}\n")
            time.sleep(600)
    if os.environ.get("FAKE_LEAK") == "1":
        child = subprocess.Popen(SLEEPER)
        (out / "pids.txt").write_text(f"{os.getpid()} {child.pid}\n")
    info |= {"status": "completed", "finished_at": "2026-01-01T00:01:00+00:00"}
    write_json(out / "trial.json", info)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
