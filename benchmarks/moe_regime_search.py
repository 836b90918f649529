"""Search for an MoE regime where routing moves as much as in the GSPO and R3 papers (issue 38).

The target (GSPO paper sec. 5.3; R3, arXiv:2510.11370): >= 10% of routers change their experts per
update, >= 50% of tokens are routed differently in at least one layer, and the model still learns
(greedy pass-rate gain >= +0.15 at lag 0). Each setting is one GRPO trial of
`configs/moe_gspo_vs_grpo.yaml` at fixed lag 0, seed 0, with the setting's overrides (a new depth
or width builds and warm-starts its own model, cached like every built-in model); the table
reports, over the trial's steps, the routing metrics the learner logs after each step's updates:

- `moe/routing_change_frac` (mean over layers of the share of scored positions whose expert set
  the step's updates changed) and its most-changed layer `moe/routing_change_frac_max`;
- `moe/token_rerouted_frac` (tokens re-routed in at least one layer: what the R3 paper's 94%
  counts), and `moe/rollout_token_rerouted_frac` (the sampler's experts vs the learner's);
- gain: the last greedy eval minus the step-0 eval (`eval/pass_rate`).

    python benchmarks/moe_regime_search.py --out /tmp/moe_search            # the default grid
    python benchmarks/moe_regime_search.py --out DIR --setting "model.num_layers=6 learner.lr=3e-4"

Each trial lives in `<out>/<index>/`; a setting already completed there is read, not rerun, so
an interrupted search resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract import metrics as M  # noqa: E402
from learner.runtime.metrics_log import MetricsLog  # noqa: E402

CONFIG = REPO / "configs" / "moe_gspo_vs_grpo.yaml"
DEFAULT_GRID = (
    "",  # the shipped regime: 2 layers, 64 experts top-8, lr 1e-4, 2 minibatches
    "model.num_layers=4",
    "model.num_layers=8",
    "model.num_layers=4 learner.lr=3e-4 learner.minibatches=4",
    "model.num_layers=8 learner.lr=3e-4 learner.minibatches=4",
    "model.num_layers=8 learner.minibatches=4",
)
COLUMNS = (
    M.MOE_ROUTING_CHANGE_FRAC,
    M.MOE_ROUTING_CHANGE_MAX,
    M.MOE_TOKEN_REROUTED_FRAC,
    M.MOE_ROLLOUT_TOKEN_REROUTED_FRAC,
)


def run_setting(out: Path, setting: str, steps: int) -> tuple[Path, float]:
    """One GRPO trial of the setting (fixed lag 0, seed 0); returns its directory and the
    seconds it took (0 when it had completed before)."""
    trial = out
    record = trial / "trial.json"
    if record.is_file() and json.loads(record.read_text()).get("status") == "completed":
        return trial, 0.0
    argv = [
        sys.executable, "-m", "harness.cli", "trial", str(CONFIG), "--arm", "grpo",
        "--seed", "0", "--lag", "0", "--out", str(trial), f"learner.steps={steps}",
        f"learner.eval_every={steps}", *setting.split(),
    ]  # fmt: skip
    started = time.monotonic()
    subprocess.run(argv, cwd=REPO, check=True)
    return trial, time.monotonic() - started


def summarise(trial: Path) -> dict[str, float]:
    """Mean of each routing metric over the trial's steps, and its greedy-eval gain."""
    rows = MetricsLog(trial).read().to_pandas().sort_values(M.STEP)
    summary = {}
    for name in COLUMNS:
        values = rows[name].to_numpy(dtype=float) if name in rows else np.array([])
        values = values[np.isfinite(values)]
        summary[name] = float(values.mean()) if len(values) else math.nan
    evals = rows[M.EVAL_PASS_RATE].to_numpy(dtype=float)
    evals = evals[np.isfinite(evals)]
    summary["gain"] = float(evals[-1] - evals[0]) if len(evals) > 1 else math.nan
    summary["start"] = float(evals[0]) if len(evals) else math.nan
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--setting", action="append", help="overrides of one setting")
    args = parser.parse_args()
    grid = args.setting or list(DEFAULT_GRID)
    header = "| setting | routers changed / update | max layer | tokens re-routed (any layer) "
    header += "| sampler vs learner tokens | eval start | gain | target met | s |"
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    results = []
    for index, setting in enumerate(grid):
        trial, seconds = run_setting(args.out / f"{index:02d}", setting, args.steps)
        s = summarise(trial)
        met = (
            s[M.MOE_ROUTING_CHANGE_FRAC] >= 0.10
            and s[M.MOE_TOKEN_REROUTED_FRAC] >= 0.50
            and s["gain"] >= 0.15
        )
        lines.append(
            f"| {setting or 'shipped'} | {s[M.MOE_ROUTING_CHANGE_FRAC]:.3f} "
            f"| {s[M.MOE_ROUTING_CHANGE_MAX]:.3f} | {s[M.MOE_TOKEN_REROUTED_FRAC]:.3f} "
            f"| {s[M.MOE_ROLLOUT_TOKEN_REROUTED_FRAC]:.3f} | {s['start']:.3f} | {s['gain']:+.3f} "
            f"| {'yes' if met else 'no'} | {seconds:.0f} |"
        )
        print(lines[-1], flush=True)
        results.append({"setting": setting or "shipped", **s, "target_met": bool(met)})
    print("\n".join(lines))
    print(json.dumps({"moe_regime_search": results}))


if __name__ == "__main__":
    main()
