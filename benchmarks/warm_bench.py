"""Warm engines: `harness run` with fresh component processes per trial vs warm ones, side by side.

Runs the same experiment twice in this process, one after the other on the same machine:
`executor.warm_components=false` (every trial starts its learner and generator processes, and
a vLLM engine, from scratch) and `true` (each slot keeps them across its trials). It prints the
experiment's wall time (driver start to report), and per trial its duration (from the pool's
start of the trial process to its reaping), its work (the learner's first step start to its last
step end: generation, training, evals, checkpoints; `work_s`) and its overhead (duration minus
work: process and engine start-up, Redis, teardown), with warm/cold ratios. It also checks that both
runs recorded bitwise-identical metrics (timing columns aside).

Usage: python benchmarks/warm_bench.py [--quick] [--config configs/quickstart.yaml]
    [overrides ...]. --quick: 2 seeds x 2 arms, 6 steps. The last line printed is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
from rich.console import Console

from contract import metrics as M
from harness.config import load_config
from harness.experiment.run import ExperimentResult, run_experiment
from learner.runtime.metrics_log import MetricsLog

REPO = Path(__file__).resolve().parents[1]
QUICK = (
    "seeds=[0, 1]",
    "arms=[{name: gspo, objective: gspo}, {name: grpo, objective: grpo}]",
    "learner.steps=6",
    "learner.eval_every=3",
    "learner.checkpoint_every=3",
)


def work_s(trial_dir: Path) -> float:
    """The learner's training from its first batch's arrival to its last step's end (rows are
    stamped at a step's end; step 1's row counts its training only, not its wait for the first
    batch, which is start-up). The step-0 eval and the first batch's generation (well under a
    second each here) count as overhead."""
    frame = MetricsLog(trial_dir).read().to_pandas().set_index(M.STEP).sort_index()
    first = frame.loc[1]
    return float(frame[M.TIMESTAMP].iloc[-1] - first[M.TIMESTAMP] + first[M.PERF_LEARNER_TRAIN_S])


def deterministic(trial_dir: Path) -> pd.DataFrame:
    frame = MetricsLog(trial_dir).read().to_pandas().sort_values(M.STEP)
    keep = [c for c in frame.columns if c != M.TIMESTAMP and not M.is_timing_dependent(c)]
    return frame[keep].reset_index(drop=True)


def run(config: Path, overrides: list[str], out: Path) -> tuple[float, ExperimentResult]:
    cfg = load_config(config, overrides)
    started = time.perf_counter()
    result = run_experiment(cfg, config, out, overrides, console=Console(quiet=True))
    wall = time.perf_counter() - started
    if result.exit_code != 0:
        raise SystemExit(f"{out}: {[(t.spec.trial_name, t.message) for t in result.trials]}")
    return wall, result


def summarise(wall: float, result: ExperimentResult) -> dict[str, float]:
    durations = [t.duration_s for t in result.trials if t.duration_s is not None]
    work = [work_s(t.spec.trial_dir) for t in result.trials]
    overhead = [d - w for d, w in zip(durations, work, strict=True)]
    return {
        "wall_s": wall,
        "trials": len(durations),
        "trial_s_median": statistics.median(durations),
        "work_s_median": statistics.median(work),
        "overhead_s_median": statistics.median(overhead),
        "overhead_s_max": max(overhead),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds x 2 arms, 6 steps")
    parser.add_argument("--config", type=Path, default=REPO / "configs/quickstart.yaml")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = [*(QUICK if args.quick else ()), *args.overrides]
    figures: dict[str, dict[str, float]] = {}
    results: dict[str, ExperimentResult] = {}
    with tempfile.TemporaryDirectory(prefix="warm_bench-") as tmp:
        for mode in ("cold", "warm"):
            warm = f"executor.warm_components={'true' if mode == 'warm' else 'false'}"
            wall, results[mode] = run(args.config, [*overrides, warm], Path(tmp) / mode)
            figures[mode] = summarise(wall, results[mode])
        same = all(
            deterministic(cold.spec.trial_dir).equals(deterministic(warm.spec.trial_dir))
            for cold, warm in zip(results["cold"].trials, results["warm"].trials, strict=True)
        )
    print(f"{'':22}{'cold':>10}{'warm':>10}{'warm/cold':>11}")
    for key in figures["cold"]:
        cold, warm = figures["cold"][key], figures["warm"][key]
        ratio = warm / cold if cold else float("nan")
        print(f"{key:22}{cold:10.2f}{warm:10.2f}{ratio:11.3f}")
    print(f"metrics bitwise equal (timing columns aside): {same}")
    ratios = {
        f"{key}_warm_over_cold": figures["warm"][key] / figures["cold"][key]
        for key in ("wall_s", "trial_s_median", "overhead_s_median")
    }
    print(json.dumps({**figures, **ratios, "bitwise_equal": same}))


if __name__ == "__main__":
    main()
