"""RL moves the built-in regime, and the report detects the quickstart's positive control.

A reduced quickstart: GRPO and its positive control (the same arm at a tenth of the learning
rate), 4 seeds, 10 steps, one eval set, the torch generator, through `harness run` and its
report, at lr 3e-5 (6x the quickstart's, which spreads its rise over 30 steps): the built-in
regime's fastest stable rise, so 10 steps suffice. Two properties of the regime (README
"Resolving power"):
- RL raises the primary greedy score well above the warm-started model's: GRPO gains ~+0.3 in
  10 steps at 3e-5 (0.5 -> ~0.8 on 256 held-out prompts), so a floor of +0.15 per seed holds on
  any CPU's trajectory, not only this machine's bitwise one;
- the report's Findings find the handicapped arm worse (Holm-adjusted paired t p < 0.05, the
  paired interval excluding 0) and its probability-of-improvement interval excludes 0.5: the
  harness shows a difference where one was planted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from contract import metrics as M
from tests.harness.mlflow_store import fresh_sqlite_store, template_store
from tests.harness.trial_helpers import REPO, metrics

# 8 short trials and a report: ~3 minutes on 2 idle cores, far longer on a loaded machine.
pytestmark = [pytest.mark.timeout(1500), pytest.mark.e2e]
STEPS = 10
SEEDS = 4
CONTROL = "grpo_lr_tenth"
OVERRIDES = [
    f"seeds=range(0,{SEEDS})",
    "learner.lr=3.0e-5",
    f"arms=[{{name: grpo, objective: grpo}}, {{name: {CONTROL}, objective: grpo, lr: 3.0e-6}}]",
    "evals=[{name: addition2}]",
    "eval.samples=0",
    "eval.pass_k=[]",
    "generation.backend=torch",
]


@pytest.fixture(scope="module")
def experiment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("control") / "run"
    # An empty, migrated MLflow store (the session's template), as `harness run` would make it.
    fresh_sqlite_store(out, template_store(request.config, tmp_path_factory))
    command = [
        sys.executable, "-m", "harness.cli", "run", str(REPO / "configs/quickstart.yaml"),
        "--out", str(out), "--steps", str(STEPS), *OVERRIDES,
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=1500, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def _gain(trial: Path) -> float:
    evals = metrics(trial)[M.EVAL_PASS_RATE].dropna()
    return float(evals.iloc[-1] - evals.iloc[0])


@pytest.mark.slow
def test_rl_raises_the_greedy_score_on_every_seed(experiment: Path) -> None:
    gains = {
        seed: _gain(experiment / "trials" / f"grpo__seed{seed}__lag0__fixed")
        for seed in range(SEEDS)
    }
    assert all(gain > 0.15 for gain in gains.values()), gains


@pytest.mark.slow
def test_the_report_detects_the_positive_control(experiment: Path) -> None:
    summary = pd.read_parquet(experiment / "report" / "summary.parquet")
    comparison = f"grpo vs {CONTROL}"
    finding = summary[(summary["section"] == "findings") & (summary["comparison"] == comparison)]
    assert len(finding) == 1, summary[summary["section"] == "findings"]
    assert finding["statistic"].iloc[0] == "detected", finding["note"].iloc[0]
    assert finding["note"].iloc[0].startswith(f"grpo beats {CONTROL} at lag 0"), finding
    improvement = summary[
        (summary["section"] == "probability_of_improvement")
        & (summary["comparison"] == comparison)
        & (summary["statistic"] == "final_score")
    ].iloc[0]
    assert improvement["ci_low"] > 0.5, improvement
    report = (experiment / "report" / "report.md").read_text()
    assert report.index("## Findings") < report.index("## Comparisons")
