"""KL estimators, truncated importance weights and the shared masked reductions."""

from __future__ import annotations

import math

import pytest
import torch

from learner.algorithms.kl import kl, kl_from_log_ratio
from learner.algorithms.masking import masked_mean, masked_sum, masked_var

LN2 = math.log(2.0)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # log r = log ref - log pi = ln 2 (ref twice as likely as pi)
        ("k1", -LN2),  # -ln 2 = -0.693147181
        ("k2", 0.5 * LN2**2),  # 0.5 * 0.480453014 = 0.240226507
        ("k3", 2.0 - 1.0 - LN2),  # 2 - 1 - 0.693147181 = 0.306852819
    ],
)
def test_kl_estimators_hand_values(kind: str, expected: float) -> None:
    logprobs = torch.tensor([[-1.0, -2.0]])
    ref = logprobs + LN2
    estimate = kl(logprobs, ref, kind)  # type: ignore[arg-type]
    assert estimate[0].tolist() == pytest.approx([expected] * 2, rel=1e-6)


def test_kl_k3_is_zero_for_identical_and_nonnegative() -> None:
    lp = torch.tensor([-0.3, -1e-4, -5.0])
    assert kl(lp, lp, "k3").tolist() == [0.0, 0.0, 0.0]
    log_ratio = torch.linspace(-30, 30, 101)
    assert torch.all(kl_from_log_ratio(log_ratio, "k3") >= 0)
    assert torch.all(torch.isfinite(kl_from_log_ratio(log_ratio, "k3")))


def test_k3_estimates_kl_in_expectation() -> None:
    # pi = N(0, 1), ref = N(0.5, 1): KL(pi || ref) = 0.5^2 / 2 = 0.125; samples from pi.
    x = torch.randn(400_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    logp = -0.5 * x**2
    logref = -0.5 * (x - 0.5) ** 2
    for kind in ("k1", "k3"):  # the unbiased ones
        assert kl(logp, logref, kind).mean().item() == pytest.approx(0.125, abs=3e-3)


def test_kl_rejects_unknown_estimator() -> None:
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl(torch.zeros(1), torch.zeros(1), "k4")  # type: ignore[arg-type]


def test_masked_reductions_ignore_padding_and_empty_rows() -> None:
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), 5.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]]).bool()
    assert masked_sum(x, mask).item() == 3.0
    assert masked_mean(x, mask).item() == 1.5
    assert masked_mean(x, mask, dim=-1).tolist() == [1.5, 0.0]  # empty row: 0, not NaN
    assert masked_var(x, mask).item() == pytest.approx(0.25)  # population: ((0.5)^2 * 2) / 2
    grad_in = x.clone().requires_grad_()
    masked_mean(grad_in, torch.zeros_like(mask)).backward()  # all padding: 0 with a graph
    assert torch.all(grad_in.grad == 0)
