"""Kaplan-Meier estimator against a hand-computed example."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.stats.survival import kaplan_meier, median_time, survival_at


def test_kaplan_meier_hand_computed() -> None:
    """Six trials; durations 2, 3, 3+, 5, 6+, 8 (+ = censored, never reached the threshold).

    t=2: at risk 6, 1 event -> S = 5/6
    t=3: at risk 5 (the censored 3 is still at risk: events before censorings), 1 event
         -> S = 5/6 * 4/5 = 2/3
    t=5: at risk 3 (5, 6+, 8), 1 event -> S = 2/3 * 2/3 = 4/9
    t=8: at risk 1, 1 event -> S = 0
    Median: first t with S <= 0.5 is 5.
    """
    km = kaplan_meier(np.array([2, 3, 3, 5, 6, 8.0]), np.array([1, 1, 0, 1, 0, 1], dtype=bool))
    assert km.times.tolist() == [2, 3, 5, 8]
    assert km.at_risk.tolist() == [6, 5, 3, 1]
    assert km.events.tolist() == [1, 1, 1, 1]
    assert km.survival == pytest.approx([5 / 6, 2 / 3, 4 / 9, 0.0])
    assert median_time(km) == 5
    assert survival_at(km, 1) == 1.0
    assert survival_at(km, 4) == pytest.approx(2 / 3)
    assert survival_at(km, 6) == pytest.approx(4 / 9)


def test_ties_in_events() -> None:
    # Durations 10, 10, 20, 30+: t=10 at risk 4, 2 events -> 1/2 = median at 10 exactly.
    km = kaplan_meier(np.array([10, 10, 20, 30.0]), np.array([1, 1, 1, 0], dtype=bool))
    assert km.survival == pytest.approx([0.5, 0.25])
    assert median_time(km) == 10


def test_not_reached_when_mostly_censored() -> None:
    # 1 of 4 reaches the threshold: S drops to 3/4 and stays there; the median is not reached.
    km = kaplan_meier(np.array([40, 60, 60, 60.0]), np.array([1, 0, 0, 0], dtype=bool))
    assert km.survival == pytest.approx([0.75])
    assert median_time(km) is None


def test_all_censored_and_empty() -> None:
    km = kaplan_meier(np.array([5.0, 6.0]), np.array([False, False]))
    assert len(km.times) == 0 and median_time(km) is None and survival_at(km, 10) == 1.0
    assert median_time(kaplan_meier(np.array([]), np.array([], dtype=bool))) is None
