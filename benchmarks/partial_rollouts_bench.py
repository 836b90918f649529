"""Partial rollouts against whole-response generation: bounded lag 1, side by side in one run.

Two real trials (embedded Redis, a torch generator process and a learner process; the same arm,
seed and prompts) at bounded max lag 1: one generates every response whole with the version it
started with, the other with `staleness.partial_rollouts` (new weights loaded between tokens,
responses continued). The script prints each trial's generator utilisation (1 - perf/
gen_idle_frac), tokens/s, learner steps/s, learner wait, and the per-token staleness the partial
trial trades for it, then the ratios partial / whole. With --pin (the default where 2 CPUs are
lent) the learner and the generator run on CPUs of their own (`executor.cpu_sets`), so idle and
wait measure the asynchrony rather than two processes contending for shared cores.

Partial rollouts pay off where a generator would otherwise wait for a version while long
responses are in flight, so the trials run `configs/long_tail.yaml` (the `repeat` task: median
response 5 tokens, p99 about 48); `--config configs/quickstart.yaml` runs the addition task,
whose responses are a few tokens, for contrast.

Usage: python benchmarks/partial_rollouts_bench.py [--quick] [--no-pin] [--config PATH]
[--check-tokens N]. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.trial_bench import pin_overrides, run_trial, summarise
from contract import metrics as M
from learner.runtime.metrics_log import MetricsLog

LAG = 1
REGIMES = {
    "whole": ("staleness.mode=bounded",),
    "partial": ("staleness.mode=bounded", "staleness.partial_rollouts=true"),
}


def token_staleness(out: Path, warmup: int) -> dict[str, float]:
    frame = MetricsLog(out).read().to_pandas().set_index(M.STEP).loc[warmup + 1 :]
    return {
        "gen_tokens_per_s": float(frame[M.PERF_GEN_TOKENS_PER_S].iloc[-1]),
        "token_lag_mean": float(frame[M.STALENESS_TOKEN_LAG_MEAN].mean()),
        "spanning_frac": float(frame[M.STALENESS_SPANNING_FRAC].mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (about a minute)")
    parser.add_argument("--no-pin", action="store_true", help="leave the CPUs shared")
    parser.add_argument(
        "--config", default="configs/long_tail.yaml", help="experiment config (its gspo arm)"
    )
    parser.add_argument(
        "--check-tokens",
        type=int,
        default=1,
        help="staleness.partial_check_tokens: tokens between checks for a newer version",
    )
    args = parser.parse_args()
    pin = () if args.no_pin or len(os.sched_getaffinity(0)) < 2 else pin_overrides()
    steps, warmup = (12, 2) if args.quick else (40, 5)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in REGIMES.items():
            out = Path(tmp) / name
            checks = (
                (f"staleness.partial_check_tokens={args.check_tokens}",)
                if name == "partial"
                else ()
            )
            run_trial(out, LAG, steps, "torch", (*pin, *overrides, *checks), config=args.config)
            figures = summarise(out, warmup) | token_staleness(out, warmup)
            figures["gen_util"] = 1.0 - figures["gen_idle_frac"]
            results[name] = figures
            print(f"{name}: " + ", ".join(f"{k}={v:.3f}" for k, v in figures.items()))
    whole, partial = results["whole"], results["partial"]
    ratios = {
        key: round(partial[key] / whole[key], 3) if whole[key] else None
        for key in ("gen_util", "gen_tokens_per_s", "steps_per_s", "learner_wait_frac")
    }
    summary = {
        "benchmark": "partial_rollouts_bench",
        "config": args.config,
        "check_tokens": args.check_tokens,
        "lag": LAG,
        "pinned": pin[0].partition("=")[2] if pin else None,
        "steps": steps,
        "whole": {k: round(v, 4) for k, v in whole.items()},
        "partial": {k: round(v, 4) for k, v in partial.items()},
        "partial_over_whole": ratios,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
