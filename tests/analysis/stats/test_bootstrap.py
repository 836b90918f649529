"""The one bootstrap engine: input checks, seeded draws that ignore the global RNG, the draw
order the report's intervals rely on, and vector-valued statistics."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.stats import BootstrapSpec, pooled_mean, stratified_bootstrap

SPEC = BootstrapSpec(n_resamples=500, confidence=0.9, seed=11)
GROUPS = [np.array([0.1, 0.4, 0.5]), np.array([0.7, 0.9])]


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([], "at least one group"),
        ([np.array([0.5])], "at least 2"),
        ([np.array([0.5, np.nan])], "non-finite"),
        ([np.ones((2, 2))], "must be 1-D"),
    ],
)
def test_rejects_unusable_groups(groups: list[np.ndarray], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stratified_bootstrap(groups, pooled_mean, SPEC)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"n_resamples": 0}, "n_resamples"), ({"confidence": 1.0}, "confidence")],
)
def test_spec_is_checked(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BootstrapSpec(**kwargs)


def test_seeded_and_independent_of_global_state() -> None:
    first = stratified_bootstrap(GROUPS, pooled_mean, SPEC)
    np.random.seed(123)  # noqa: NPY002 - the legacy global state must not matter
    np.random.random(10)  # noqa: NPY002
    assert stratified_bootstrap(GROUPS, pooled_mean, SPEC) == first
    other = stratified_bootstrap(GROUPS, pooled_mean, BootstrapSpec(500, 0.9, seed=12))
    assert other != first


def test_draw_order_is_group_by_group() -> None:
    # One integers(0, n_j, (B, n_j)) block per group, groups in order, from default_rng(seed);
    # the percentile interval of the pooled mean over those exact resamples.
    rng = np.random.default_rng(11)
    blocks = [g[rng.integers(0, len(g), size=(500, len(g)))] for g in GROUPS]
    samples = np.concatenate(blocks, axis=1).mean(axis=1)  # (B,)
    tail = (1 - 0.9) / 2 * 100  # 5th and 95th percentiles
    low, high = stratified_bootstrap(GROUPS, pooled_mean, SPEC)
    assert low == np.percentile(samples, tail) and high == np.percentile(samples, 100 - tail)


def test_vector_statistic_gives_a_bound_per_component() -> None:
    low, high = stratified_bootstrap(
        GROUPS, lambda r: np.stack([g.mean(axis=-1) for g in r], axis=-1), SPEC
    )
    assert low.shape == high.shape == (2,)
    # each group's mean stays within its own range: stratification never mixes groups
    assert 0.1 <= low[0] <= high[0] <= 0.5 and 0.7 <= low[1] <= high[1] <= 0.9
