"""One learner step per new arm (CISPO, SAPO, GMPO, Clip-Cov, KL-Cov) on a tiny real model:
finite, updates the weights, logs every policy stat; and the fixed mode stays bitwise
reproducible, Clip-Cov's random draw included."""

from __future__ import annotations

import math

import pytest
import torch

from contract import metrics as M
from tests.learner.objective_inputs import STAT_KEYS
from tests.learner.test_step import one_step
from tests.learner.tiny import save_tiny_policy

ZOO = ["cispo", "sapo", "gmpo", "clip_cov", "kl_cov"]


@pytest.mark.parametrize("objective", ZOO)
def test_one_step_per_new_arm(tmp_path, objective: str) -> None:
    model_dir = save_tiny_policy(tmp_path / "model")
    result, before, after = one_step(model_dir, objective)
    m = result.metrics
    assert math.isnan(m.pop(M.STALENESS_KL_BEHAVIOR))  # every row from the current version
    assert all(math.isfinite(v) for v in m.values()), m
    assert set(m) >= STAT_KEYS
    assert len(result.grad_norms) == 2 and all(g > 0 for g in result.grad_norms)
    assert m["policy/ratio_min"] <= 1.0 <= m["policy/ratio_max"]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert "value/loss" not in m  # none of them trains a critic


def test_clip_cov_step_is_bitwise_reproducible(tmp_path) -> None:
    """With wide covariance bounds many tokens are candidates and the draw matters: two runs of
    the same step give the same weights bit for bit."""
    model_dir = save_tiny_policy(tmp_path / "model")
    settings = {"clip_fraction": 0.3, "cov_low": -1e9, "cov_high": 1e9}
    (first, _, weights_a), (second, _, weights_b) = (
        one_step(model_dir, "clip_cov", **settings) for _ in range(2)
    )
    assert all(torch.equal(a, b) for a, b in zip(weights_a, weights_b, strict=True))
    assert first.grad_norms == second.grad_norms
