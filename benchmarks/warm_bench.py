"""Warm engines: `harness run` with fresh, forked or warm component processes, side by side.

Runs the same experiment three times in this process, one after the other on the same machine:
`cold` (`executor.warm_components=false executor.fork_components=false`: every trial starts its
learner and generator processes, and a vLLM engine, from scratch), `forked` (`warm_components=
false`: every component forked by the experiment's zygote, which imported torch and
transformers once; the engine still starts per trial) and `warm` (each slot keeps its processes
and engine across its trials). A zygote named in this process's environment is ignored, so each
mode is what it says. It prints the
experiment's wall time (driver start to report), and per trial its duration (from the pool's
start of the trial process to its reaping), its work (the learner's first step start to its last
step end: generation, training, evals, checkpoints; `work_s`) and its overhead (duration minus
work: process and engine start-up, Redis, teardown), with ratios over cold. It also checks that
the runs recorded bitwise-identical metrics (timing columns aside).

Usage: python benchmarks/warm_bench.py [--quick] [--config configs/quickstart.yaml]
    [overrides ...]. --quick: 2 seeds x 2 arms, 6 steps. The last line printed is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
from rich.console import Console

from contract import metrics as M
from harness.config import load_config
from harness.experiment.run import ExperimentRequest, ExperimentResult, run_experiment
from harness.launch.forked_child import ZYGOTE_ENV
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
    request = ExperimentRequest(cfg, config, out, overrides)
    result = run_experiment(request, console=Console(quiet=True))
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
    os.environ.pop(ZYGOTE_ENV, None)
    modes = {
        "cold": ["executor.warm_components=false", "executor.fork_components=false"],
        "forked": ["executor.warm_components=false", "executor.fork_components=true"],
        "warm": ["executor.warm_components=true"],
    }
    figures: dict[str, dict[str, float]] = {}
    results: dict[str, ExperimentResult] = {}
    with tempfile.TemporaryDirectory(prefix="warm_bench-") as tmp:
        for mode, settings in modes.items():
            wall, results[mode] = run(args.config, [*overrides, *settings], Path(tmp) / mode)
            figures[mode] = summarise(wall, results[mode])
        same = all(
            deterministic(cold.spec.trial_dir).equals(deterministic(other.spec.trial_dir))
            for mode in ("forked", "warm")
            for cold, other in zip(results["cold"].trials, results[mode].trials, strict=True)
        )
    print(f"{'':22}{'cold':>10}{'forked':>10}{'warm':>10}{'forked/cold':>13}{'warm/cold':>11}")
    for key in figures["cold"]:
        cold, forked, warm = (figures[mode][key] for mode in modes)
        ratios = [other / cold if cold else float("nan") for other in (forked, warm)]
        print(f"{key:22}{cold:10.2f}{forked:10.2f}{warm:10.2f}{ratios[0]:13.3f}{ratios[1]:11.3f}")
    print(f"metrics bitwise equal (timing columns aside): {same}")
    ratios = {
        f"{key}_{mode}_over_cold": figures[mode][key] / figures["cold"][key]
        for mode in ("forked", "warm")
        for key in ("wall_s", "trial_s_median", "overhead_s_median")
    }
    print(json.dumps({**figures, **ratios, "bitwise_equal": same}))


if __name__ == "__main__":
    main()
