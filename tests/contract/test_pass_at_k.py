"""The unbiased pass@k estimator (Chen et al. 2021) against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from contract.pass_at_k import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(("n", "c"), [(4, 0), (4, 1), (4, 3), (10, 7), (1, 1)])
def test_pass_at_1_is_the_fraction_correct(n: int, c: int) -> None:
    # 1 - C(n-c, 1) / C(n, 1) = 1 - (n - c) / n = c / n
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, rel=1e-12, abs=1e-15)


def test_pass_at_n_is_whether_any_sample_is_correct() -> None:
    # k = n: the only draw of n samples is all of them; it passes iff c >= 1.
    assert pass_at_k(5, 0, 5) == 0.0
    assert pass_at_k(5, 1, 5) == 1.0
    assert pass_at_k(5, 3, 5) == 1.0


def test_all_correct_and_none_correct() -> None:
    assert pass_at_k(8, 8, 1) == 1.0
    assert pass_at_k(8, 8, 3) == 1.0
    assert pass_at_k(8, 0, 1) == 0.0
    assert pass_at_k(8, 0, 8) == 0.0


def test_mid_cases_by_hand() -> None:
    # n=4, c=2, k=2: 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6, rel=1e-12)
    # n=5, c=1, k=2: 1 - C(4,2)/C(5,2) = 1 - 6/10 = 0.4
    assert pass_at_k(5, 1, 2) == pytest.approx(0.4, rel=1e-12)
    # n=10, c=3, k=4: 1 - C(7,4)/C(10,4) = 1 - 35/210 = 5/6
    assert pass_at_k(10, 3, 4) == pytest.approx(5 / 6, rel=1e-12)
    # n - c < k: every draw of k holds a correct sample. n=4, c=3, k=2 -> 1
    assert pass_at_k(4, 3, 2) == 1.0


def test_product_form_equals_the_binomial_ratio_for_large_n() -> None:
    # The binomials here are ~1e58; the product form stays accurate.
    n, c, k = 200, 37, 50
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


def test_mean_over_problems() -> None:
    # Problems with c = 0, 2, 4 of n = 4, k = 2: (0 + 5/6 + 1) / 3 = 11/18
    assert mean_pass_at_k([0, 2, 4], 4, 2) == pytest.approx(11 / 18, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_invalid_arguments_are_refused(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="must be in"):
        pass_at_k(n, c, k)
    with pytest.raises(ValueError, match="no problems"):
        mean_pass_at_k([], 4, 1)
