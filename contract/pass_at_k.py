"""The unbiased pass@k estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on
Code", arXiv:2107.03374, section 2.1), as a pure function both the trial side (the learner's
evals) and the analysis may import.

With n samples of a problem of which c are correct, pass@k = 1 - C(n - c, k) / C(n, k): one minus
the chance that k samples drawn without replacement from the n are all wrong. The binomials
overflow for moderate n, so the paper's product form is used:
    C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i),
which is exact in rational arithmetic and stable in floating point (each factor is in [0, 1)).
When n - c < k every draw of k holds a correct sample, and pass@k = 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `c` correct out of `n` samples (needs 1 <= k <= n)."""
    if not 0 <= c <= n:
        raise ValueError(f"correct count c={c} must be in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, n={n}]: pass@k needs at least k samples")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(correct: Sequence[int], n: int, k: int) -> float:
    """pass@k averaged over problems, each with `n` samples and `correct[j]` of them correct."""
    if not correct:
        raise ValueError("no problems to average pass@k over")
    return sum(pass_at_k(n, c, k) for c in correct) / len(correct)
