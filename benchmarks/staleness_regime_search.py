"""Search for a CPU regime where staleness costs score (issue 52): AReaL's ablation in miniature.

AReaL (Fu et al. 2025, table of max staleness 0 / 2 / 4 / 8 / 16 / inf) finds naive PPO falling
from 42.0 to 23.3 at staleness 4 while decoupled PPO holds. At the quickstart's learning rate
the built-in model barely moves between versions, so a policy 4 versions old samples what the
current one would and every lag scores alike: the harness could not show a staleness cost there
even if its machinery were broken. This searches for settings where the per-version policy
change is large enough that the `naive` correction at fixed lag 4 is detectably worse than at
lag 0, on the built-in task and model.

Each setting is one `harness run` of `configs/quickstart.yaml` with one arm (GRPO, correction
`naive`), fixed lags 0 and 4, `--seeds` seeds, one greedy eval set, and the setting's overrides;
the table reads the experiment's report: the lag Findings line (naive at lag 4 vs lag 0 on the
final score: paired mean difference, its interval, Holm p), the final scores, and how far the
stale behaviour policies were from the learner (`staleness/kl_behavior`, k3, mean over steps
and seeds at lag 4).

    python benchmarks/staleness_regime_search.py --out /tmp/staleness_search      # default grid
    python benchmarks/staleness_regime_search.py --out DIR --setting "learner.lr=3e-4"

Each setting's experiment lives in `<out>/<index>/`; a setting already reported there is read,
not rerun, so an interrupted search resumes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "quickstart.yaml"
DEFAULT_GRID = (
    "learner.lr=3e-5",  # the corrections study's rate: expected no staleness cost
    "learner.lr=1e-4",
    "learner.lr=3e-4",
    "learner.lr=1e-4 learner.minibatches=4",
    "learner.lr=3e-4 learner.minibatches=4",
)
LAGS = (0, 4)
BASE = (
    "arms=[{name: naive, objective: grpo, correction: naive}]",
    f"staleness.lags=[{', '.join(str(lag) for lag in LAGS)}]",
    "staleness.mode=fixed",
    "evals=[{name: addition2}]",
    "eval.samples=0",
    "eval.pass_k=[]",
    "report.make_figures=false",
)


def run_setting(out: Path, setting: str, seeds: int) -> float:
    """One experiment of the setting; the seconds it took (0 when its report existed)."""
    if (out / "report" / "summary.parquet").is_file():
        return 0.0
    argv = [
        sys.executable, "-m", "harness.cli", "run", str(CONFIG), "--out", str(out),
        *BASE, f"seeds=range(0,{seeds})", *setting.split(),
    ]  # fmt: skip
    started = time.monotonic()
    subprocess.run(argv, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def summarise(out: Path) -> dict[str, object]:
    """The lag-4 line of the report, the final scores per lag, and the behaviour KL at lag 4."""
    summary = pd.read_parquet(out / "report" / "summary.parquet")
    line = summary[
        (summary["section"] == "findings")
        & (summary["arm"] == "naive")
        & (summary["lag"] == LAGS[-1])
    ].iloc[0]
    claims = summary[
        (summary["section"] == "claims")
        & (summary["arm"] == "naive")
        & (summary["lag"] == LAGS[-1])
        & (summary["statistic"] == "final_score_diff_p_holm")
    ]
    final = summary[(summary["section"] == "final_score") & (summary["statistic"] == "mean")]
    kl = summary[
        (summary["section"] == "staleness")
        & (summary["statistic"] == "kl_behavior_mean")
        & (summary["lag"] == LAGS[-1])
    ]
    by_lag = {int(r.lag): float(r.value) for r in final.itertuples() if pd.notna(r.lag)}
    return {
        "final@0": by_lag.get(LAGS[0], float("nan")),
        f"final@{LAGS[-1]}": by_lag.get(LAGS[-1], float("nan")),
        "diff": float(line["value"]),
        "ci": f"[{line['ci_low']:.3f}, {line['ci_high']:.3f}]",
        "holm_p": float(claims["value"].iloc[0]) if len(claims) else float("nan"),
        "verdict": str(line["statistic"]),
        "kl_behavior": float(kl["value"].iloc[0]) if len(kl) else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--setting", action="append", help="overrides of one setting")
    args = parser.parse_args()
    rows = []
    for index, setting in enumerate(args.setting or DEFAULT_GRID):
        seconds = run_setting(args.out / str(index), setting, args.seeds)
        rows.append({"setting": setting, **summarise(args.out / str(index)), "s": round(seconds)})
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print(flush=True)


if __name__ == "__main__":
    main()
