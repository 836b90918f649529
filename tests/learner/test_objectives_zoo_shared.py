"""What CISPO, SAPO, GMPO, Clip-Cov and KL-Cov share with every objective (design section 6):
the standard stats, ratio 1 and nothing clipped at identical policies, padding changing nothing,
far off-policy tokens; and their arm configs. The reference-KL term, dtypes and empty batches
are checked for every objective in `test_objectives_shared.py`."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from learner.algorithms.objectives import ClipCovSettings, KLCovSettings, SAPOSettings
from learner.config import ArmConfig, make_arm
from tests.learner.objective_inputs import (
    assert_identical_policy_stats,
    identical_batch,
    layout,
    leaf,
    opts,
    response,
    run,
)

ZOO = ["cispo", "sapo", "gmpo", "clip_cov", "kl_cov"]


@pytest.mark.parametrize("name", ZOO)
def test_identical_policies_ratio_one_nothing_clipped(name: str) -> None:
    lp, mask, adv = identical_batch()
    logprobs = leaf(lp)
    loss, stats = run(name, logprobs, lp.clone(), adv, mask, opts(name))
    loss.backward()
    assert loss.dtype == torch.float32
    assert_identical_policy_stats(stats)
    assert torch.all(logprobs.grad[~mask] == 0) and torch.all(torch.isfinite(logprobs.grad))


@pytest.mark.parametrize("name", ZOO)
def test_padding_and_prompt_slots_change_nothing(name: str) -> None:
    """Uneven rows laid out at two widths, with different junk (even inf / nan) off the mask."""
    rows = [[-0.3, -1.2, -2.0], [-0.8], [-0.1, -0.4]]
    shifts = [[0.1, -0.5, 0.3], [-0.2], [0.6, -0.1]]
    adv = torch.tensor([1.5, -0.5, 0.7])
    results = []
    for prompt, width, junk in ((2, 6, -7.5), (3, 9, math.inf)):
        lp, mask = layout(rows, prompt=prompt, width=width, junk=junk)
        l_rows, _ = layout(shifts, prompt=prompt, width=width, junk=0.0)
        weights, _ = layout([[0.9, 1.1, 1.0], [0.7], [1.2, 0.8]], prompt, width, math.nan)
        logprobs = leaf(lp)
        old = torch.where(mask, lp - l_rows, junk)
        loss, stats = run(name, logprobs, old, adv, mask, opts(name), is_weights=weights)
        loss.backward()
        assert torch.all(logprobs.grad[~mask] == 0)
        results.append((loss.item(), response(logprobs.grad, mask), stats))
    (loss_a, grad_a, stats_a), (loss_b, grad_b, stats_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-6)  # sums over other widths: rounding only
    for row_a, row_b in zip(grad_a, grad_b, strict=True):
        assert row_a == pytest.approx(row_b, rel=1e-6)
    assert stats_a == pytest.approx(stats_b, rel=1e-6)


@pytest.mark.parametrize("name", ZOO)
def test_far_off_policy_tokens_stay_finite(name: str) -> None:
    """A floored log-prob (-87, a token outside the nucleus) against a normal one, both ways."""
    lp, mask = layout([[-87.3, -0.5], [-0.2]])
    old, _ = layout([[-0.4, -87.3], [-0.3]])
    logprobs = leaf(lp)
    loss, stats = run(name, logprobs, old, torch.tensor([1.0, -1.0]), mask, opts(name))
    loss.backward()
    assert math.isfinite(loss.item()) and torch.all(torch.isfinite(logprobs.grad))
    assert all(math.isfinite(v) for v in stats.values())


def _read(settings: object, *names: str) -> tuple:
    return tuple(getattr(settings, name) for name in names)


SHARED = ("eps_low", "eps_high", "aggregation", "beta", "kl_estimator")


def test_arms_are_the_settings_their_objectives_read() -> None:
    sapo = make_arm(name="s", objective="sapo", tau_neg=2.0)
    assert isinstance(sapo, SAPOSettings)
    assert _read(sapo, *SHARED, "tau_pos", "tau_neg") == (
        math.inf, math.inf, "seq-mean-token-mean", 0.0, "k3", 1.0, 2.0,
    )  # fmt: skip
    clip_cov = make_arm(name="c", objective="clip_cov", beta=0.1)
    assert isinstance(clip_cov, ClipCovSettings)
    assert _read(clip_cov, *SHARED, "clip_fraction", "cov_low", "cov_high") == (
        1.0, 1.0, "token-mean", 0.1, "k3", 2e-4, 1.0, 5.0,
    )  # fmt: skip
    kl_cov = make_arm(name="k", objective="kl_cov")
    assert isinstance(kl_cov, KLCovSettings)
    assert _read(kl_cov, *SHARED, "kl_fraction", "kl_coef") == (
        math.inf, math.inf, "token-mean", 0.0, "k3", 2e-3, 1.0,
    )  # fmt: skip
    gmpo = make_arm(name="g", objective="gmpo", eps_high=0.6)
    assert _read(gmpo, "eps_low", "eps_high", "aggregation") == (0.4, 0.6, "seq-mean-token-mean")


@pytest.mark.parametrize(("name", "hint"), [("sapo", "tau_pos/tau_neg"), ("kl_cov", "kl_coef")])
def test_clip_free_arms_refuse_a_clip_range_by_name(name: str, hint: str) -> None:
    with pytest.raises(ValidationError, match=rf"does not read eps_high \(.*{hint}.*only .*grpo"):
        make_arm(name="a", objective=name, eps_high=0.2)


def test_clip_cov_bounds_must_leave_room_for_candidates() -> None:
    with pytest.raises(ValidationError, match=r"cov_low=5.0 must be below cov_high=1.0"):
        make_arm(name="c", objective="clip_cov", cov_low=5.0, cov_high=1.0)


@pytest.mark.parametrize("name", ZOO)
def test_arms_dump_and_validate_again(name: str) -> None:
    from pydantic import TypeAdapter

    adapter = TypeAdapter(ArmConfig)
    arm = make_arm(name="a", objective=name, beta=0.05)
    dumped = adapter.dump_python(arm)
    assert "eps_low" not in dumped if name in {"sapo", "kl_cov"} else "eps_low" in dumped
    assert adapter.validate_python(dumped) == arm
