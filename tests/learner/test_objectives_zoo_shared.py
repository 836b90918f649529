"""What CISPO, SAPO, GMPO, Clip-Cov and KL-Cov share with every objective (design section 6):
the standard stats, ratio 1 and nothing clipped at identical policies, padding changing nothing,
far off-policy tokens; and their arm configs. The reference-KL term, dtypes and empty batches
are checked for every objective in `test_objectives_shared.py`."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from learner.algorithms.options import ClipCovOptions, KLCovOptions, SAPOOptions
from learner.config import ArmConfig, make_arm
from tests.learner.objective_inputs import (
    STAT_KEYS,
    identical_batch,
    layout,
    leaf,
    loss_of,
    opts,
    response,
)

ZOO = ["cispo", "sapo", "gmpo", "clip_cov", "kl_cov"]


@pytest.mark.parametrize("name", ZOO)
def test_identical_policies_ratio_one_nothing_clipped(name: str) -> None:
    lp, mask, adv = identical_batch()
    logprobs = leaf(lp)
    loss, stats = loss_of(name)(logprobs, lp.clone(), adv, mask, opts(name))
    loss.backward()
    assert loss.dtype == torch.float32 and set(stats) == STAT_KEYS
    for key in ("ratio_mean", "ratio_min", "ratio_max", "ratio_seq_mean", "ratio_token_mean"):
        assert stats[key] == 1.0, key
    for key in ("clip_frac", "clip_frac_seq", "clip_frac_low", "clip_frac_high", "kl_old"):
        assert stats[key] == 0.0, key
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
        loss, stats = loss_of(name)(logprobs, old, adv, mask, opts(name), is_weights=weights)
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
    loss, stats = loss_of(name)(logprobs, old, torch.tensor([1.0, -1.0]), mask, opts(name))
    loss.backward()
    assert math.isfinite(loss.item()) and torch.all(torch.isfinite(logprobs.grad))
    assert all(math.isfinite(v) for v in stats.values())


def test_arms_build_their_options() -> None:
    sapo = make_arm(name="s", objective="sapo", tau_neg=2.0).objective_options(16)
    assert sapo == SAPOOptions(
        eps_low=math.inf, eps_high=math.inf, agg="seq-mean-token-mean", tau_pos=1.0, tau_neg=2.0
    )
    clip_cov = make_arm(name="c", objective="clip_cov", beta=0.1).objective_options(16)
    assert clip_cov == ClipCovOptions(
        eps_low=1.0, eps_high=1.0, agg="token-mean", beta=0.1,
        clip_fraction=2e-4, cov_low=1.0, cov_high=5.0,
    )  # fmt: skip
    kl_cov = make_arm(name="k", objective="kl_cov").objective_options(16)
    assert kl_cov == KLCovOptions(
        eps_low=math.inf, eps_high=math.inf, agg="token-mean", kl_fraction=2e-3, kl_coef=1.0
    )
    gmpo = make_arm(name="g", objective="gmpo", eps_high=0.6).objective_options(16)
    assert (gmpo.eps_low, gmpo.eps_high, gmpo.agg) == (0.4, 0.6, "seq-mean-token-mean")


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
