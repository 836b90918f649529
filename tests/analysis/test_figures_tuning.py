"""The tuning protocol's figures render to PNG and refuse empty input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.figures_tuning import (
    plot_expected_max,
    plot_sensitivity,
    sensitivity_figure,
)
from analysis.stats import expected_max_curve, sensitivity_table
from analysis.stats.expected_max import SENSITIVITY_COLUMNS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def curves() -> dict:
    rng = np.random.default_rng(0)
    return {
        "grpo": expected_max_curve(rng.normal(0.5, 0.05, size=12)),
        "gspo": expected_max_curve(rng.normal(0.45, 0.15, size=20)),
    }


def table() -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = [
        (arm, lr, clip, opt, seed, rng.uniform())
        for arm in ("grpo", "gspo")
        for lr in (1e-6, 3e-6, 1e-5)
        for clip in (0.1, 0.2)
        for opt in ("adam", "sgd")
        for seed in range(3)
    ]
    frame = pd.DataFrame(rows, columns=["arm", "lr", "clip", "opt", "seed", "score"])
    return sensitivity_table(frame, param_cols=["lr", "clip", "opt"], n_resamples=200)


def assert_png(path: Path) -> None:
    assert path.is_file()
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert path.stat().st_size > 10_000  # axes, lines and text, not a blank canvas


def test_plot_expected_max_writes_a_png(tmp_path: Path) -> None:
    out = plot_expected_max(curves(), tmp_path / "figs" / "evp.png")
    assert out == tmp_path / "figs" / "evp.png"
    assert_png(out)


def test_plot_sensitivity_writes_a_png(tmp_path: Path) -> None:
    out = plot_sensitivity(table(), tmp_path / "sensitivity.png")
    assert_png(out)


def test_sensitivity_axes_scale_with_the_values() -> None:
    fig = sensitivity_figure(table())
    lr, clip, opt = fig.axes[:3]
    assert lr.get_xscale() == "log"  # 1e-6 .. 1e-5: 10x
    assert clip.get_xscale() == "linear"  # 0.1 .. 0.2: 2x
    assert [t.get_text() for t in opt.get_xticklabels()] == ["adam", "sgd"]


def test_reject_empty_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one arm"):
        plot_expected_max({}, tmp_path / "evp.png")
    with pytest.raises(ValueError, match="empty sensitivity table"):
        plot_sensitivity(pd.DataFrame(columns=SENSITIVITY_COLUMNS), tmp_path / "s.png")
    with pytest.raises(ValueError, match="columns"):
        plot_sensitivity(pd.DataFrame({"x": [1]}), tmp_path / "s.png")
    assert not list(tmp_path.iterdir())  # nothing written
