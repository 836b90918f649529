"""Staleness versus utilisation: bounded-mode trials at lag 0, 1, 2, 4, side by side in one run.

For each max lag, one real trial (embedded Redis, a generator process and a learner process)
runs the same arm, seed and prompts; the script reads its metrics and prints learner steps/s,
perf/learner_wait_frac and perf/gen_idle_frac, with the speed-up over lag 0 as ratios. At lag 0
the learner and the generator alternate (one waits while the other works), so on 2 cores the
ideal speed-up from overlapping them is 2x.

With --pin the learner runs on one CPU and the generator on another (`executor.cpu_sets`), so
wait and idle measure the asynchrony, not two processes contending for shared cores.

Usage: python benchmarks/trial_bench.py [--quick] [--backend vllm|torch] [--pin]. The last line
printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from contract import metrics as M
from learner.runtime.metrics_log import MetricsLog

REPO = Path(__file__).resolve().parents[1]
LAGS = (0, 1, 2, 4)


def run_trial(
    out: Path,
    lag: int,
    steps: int,
    backend: str,
    pin: tuple[str, ...] = (),
    *,
    config: str = "configs/quickstart.yaml",
) -> None:
    """One bounded-mode trial of `config`'s gspo arm (seed 0) at max lag `lag`."""
    command = [
        sys.executable, "-m", "harness.cli", "trial", str(REPO / config),
        "--arm", "gspo", "--seed", "0", "--lag", str(lag), "--mode", "bounded",
        "--out", str(out), "--steps", str(steps), f"generation.backend={backend}",
        "learner.checkpoint_every=5", "learner.eval_every=1000", *pin,
    ]  # fmt: skip
    subprocess.run(command, check=True, cwd=REPO, capture_output=True, timeout=1800)


def summarise(out: Path, warmup: int) -> dict[str, float]:
    """Steady-state figures: the first `warmup` steps (engine start, first weights) are skipped."""
    frame = MetricsLog(out).read().to_pandas().set_index(M.STEP).loc[warmup + 1 :]
    span = frame[M.TIMESTAMP].iloc[-1] - frame[M.TIMESTAMP].iloc[0]
    per_step = span / (len(frame) - 1)
    step_s = frame[M.PERF_LEARNER_STEP_S]
    # Where a step's wall time goes (seconds per step; checkpoint amortised over all steps).
    # `other` is the rest of the step's wall time: metrics, ledger, telemetry reads.
    breakdown = {
        "wait_s": float((step_s * frame[M.PERF_LEARNER_WAIT_FRAC]).mean()),
        "train_s": float(frame[M.PERF_LEARNER_TRAIN_S].mean()),
        "publish_s": float(frame[M.PERF_WEIGHT_PUBLISH_S].mean()),
        "checkpoint_s": float(frame[M.PERF_CHECKPOINT_S].fillna(0.0).mean()),
    }
    breakdown["other_s"] = per_step - sum(breakdown.values())
    return {
        "steps_per_s": 1.0 / per_step,
        **breakdown,
        "generator_reload_s": float(frame[M.PERF_WEIGHT_SYNC_S].median()),
        "learner_wait_frac": float(np.median(frame[M.PERF_LEARNER_WAIT_FRAC])),
        "gen_idle_frac": float(frame[M.PERF_GEN_IDLE_FRAC].iloc[-1]),
        "learner_cpu_frac": float(frame[M.PERF_LEARNER_CPU_FRAC].median()),
        "staleness_mean": float(frame[M.STALENESS_MEAN].mean()),
        "staleness_max": float(frame[M.STALENESS_MAX].max()),
        "dropped_stale": float(frame[M.BUFFER_DROPPED_STALE].iloc[-1]),
    }


def pin_overrides() -> tuple[str, ...]:
    """executor.cpu_sets: the learner on the first CPU this process may use, the generator on
    the second."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs 2 CPUs; this machine lends 1")
    return (f"executor.cpu_sets={{learner: '{cpus[0]}', generators: ['{cpus[1]}']}}",)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (under a few minutes)")
    parser.add_argument("--backend", default="vllm", choices=["vllm", "torch"])
    parser.add_argument("--lags", default=",".join(map(str, LAGS)), help="comma-separated")
    parser.add_argument(
        "--pin", action="store_true", help="learner and generator on CPUs of their own"
    )
    args = parser.parse_args()
    pin = pin_overrides() if args.pin else ()
    lags = [int(x) for x in args.lags.split(",")]
    if lags[0] != 0:
        parser.error("--lags must start with 0 (the speed-ups are over lag 0)")
    steps, warmup = (12, 2) if args.quick else (40, 5)
    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for lag in lags:
            out = Path(tmp) / f"lag{lag}"
            run_trial(out, lag, steps, args.backend, pin)
            results[lag] = summarise(out, warmup)
            print(f"lag {lag}: " + ", ".join(f"{k}={v:.3f}" for k, v in results[lag].items()))
    base = results[0]["steps_per_s"]
    summary = {
        "benchmark": "trial_bench",
        "note": "per-step seconds: wait + train + publish + checkpoint + other = 1 / steps_per_s; "
        "generator_reload_s is the generator's weight load per new version",
        "backend": args.backend,
        "pinned": pin[0].partition("=")[2] if pin else None,
        "steps": steps,
        "by_lag": {str(lag): {k: round(v, 4) for k, v in r.items()} for lag, r in results.items()},
        "speedup_over_lag0": {
            str(lag): round(r["steps_per_s"] / base, 3) for lag, r in results.items()
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
