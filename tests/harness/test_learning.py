"""RL actually improves the policy: eval pass rate rises above its start for GSPO and GRPO.

Runs the quickstart's optimisation settings (16 prompts x 8 samples per step, two minibatch
updates, lr 1e-4) for 40 steps with the torch generator in fixed mode, which is bitwise
reproducible, so this is a deterministic check rather than a lucky draw.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contract import metrics as M
from tests.harness.trial_helpers import REPO, metrics, status

STEPS = 40


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["gspo", "grpo"])
def test_eval_pass_rate_rises(tmp_path: Path, arm: str) -> None:
    command = [
        sys.executable, "-m", "harness.cli", "trial", str(REPO / "configs/quickstart.yaml"),
        "--arm", arm, "--seed", "0", "--lag", "0", "--out", str(tmp_path),
        "--steps", str(STEPS), "generation.backend=torch",
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=900, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert status(tmp_path) == "completed"
    evals = metrics(tmp_path)[M.EVAL_PASS_RATE].dropna()
    start, later = evals.iloc[0], evals.iloc[-2:].mean()
    assert later > start + 0.05, evals.to_dict()
