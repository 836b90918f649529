"""Intervals for a count of k events in n trials (divergences, trials reaching a threshold).

The Wilson score interval (Wilson 1927) keeps sensible coverage at the tiny n and k = 0 or n
typical here, where the Wald interval collapses to zero width (Brown, Cai & DasGupta 2001).
"""

from __future__ import annotations

import math

from statsmodels.stats.proportion import proportion_confint


def wilson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (statsmodels `proportion_confint`).

    At k = 0 the lower bound is exactly 0 and at k = n the upper bound exactly 1: the score
    interval's centre (k + z^2/2) / (n + z^2) and half-width coincide there, but statsmodels'
    floating-point difference leaves e.g. 5.55e-17 instead of 0, which the report would print.
    """
    if n == 0:
        return math.nan, math.nan
    low, high = proportion_confint(k, n, alpha=1 - confidence, method="wilson")
    return (0.0 if k == 0 else float(low)), (1.0 if k == n else float(high))
