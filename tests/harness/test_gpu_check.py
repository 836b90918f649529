"""The prepared GPU check (scripts/gpu_check.sh), as far as a CPU-only machine can check it.

What runs here: the script parses, it refuses at once (non-zero, no setup, nothing installed)
where no NVIDIA GPU is visible, its trial config validates with every component on CUDA, and its
trial checker refuses a trial that ran on the CPU while accepting everything else about it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import load_config
from tests.harness.trial_helpers import SMALL_MODEL

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
CONFIG = REPO / "configs" / "gpu_check.yaml"


def test_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine: not refused")
def test_refuses_without_a_gpu_before_setting_anything_up(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, copy / "scripts" / "gpu_check.sh")
    result = subprocess.run(
        ["bash", str(copy / "scripts" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert "refuses to fall back to the CPU" in result.stderr
    assert result.stdout == ""  # no JSON line: nothing passed
    assert sorted(p.name for p in copy.iterdir()) == ["scripts"]  # no .venv, nothing set up


def test_config_puts_every_component_on_cuda_in_bf16() -> None:
    cfg = load_config(CONFIG)
    assert cfg.model.path == "builtin"  # no download
    assert (cfg.generation.backend, cfg.generation.device) == ("vllm", "cuda")
    assert cfg.generation.dtype == "bfloat16"
    assert cfg.learner.device == "cuda"
    assert cfg.staleness.mode == "fixed"


@pytest.mark.slow
@pytest.mark.e2e
def test_trial_checker_refuses_a_cpu_trial(tmp_path: Path) -> None:
    """The same config moved to the CPU completes, and the checker still fails it, for the
    device alone: the GPU check can never pass on a CPU fallback. Made small (the end-to-end
    tests' built-in model, 4 prompts x 4 samples, no MLflow): the checker reads the trials."""
    out = tmp_path / "run"
    cpu = [
        "generation.backend=torch",
        "generation.device=cpu",
        "generation.dtype=float32",
        "learner.device=cpu",
        "learner.eval_every=2",
        "learner.checkpoint_every=2",
        *SMALL_MODEL,
        "generation.group_size=4",
        "learner.prompts_per_step=4",
        "tracking.enabled=false",
    ]
    run = [sys.executable, "-m", "harness.cli", "run", str(CONFIG), "--out", str(out)]
    result = subprocess.run(
        [*run, "--steps", "2", *cpu],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checker = [sys.executable, str(REPO / "scripts" / "gpu_check_trial.py"), str(out)]
    refused = subprocess.run(checker, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 1
    assert "records no CUDA device" in refused.stderr
    assert refused.stdout == ""


def test_trial_checker_refuses_an_experiment_without_trials(tmp_path: Path) -> None:
    checker = [sys.executable, str(REPO / "scripts" / "gpu_check_trial.py"), str(tmp_path)]
    result = subprocess.run(checker, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert f"{tmp_path}: no trials" in result.stderr
    assert result.stdout == ""
