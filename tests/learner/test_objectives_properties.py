"""Padding invariance and finiteness of every objective, by example and by hypothesis.

The property tests are reproducible: tests/conftest.py loads a derandomized hypothesis profile
(the examples are a function of the test), and their domains are realistic: log-probs (of the
policy, pi_old and the reference) are finite float32 values <= 0, advantages finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import Tensor

from contract import metrics as M
from learner.algorithms.kl import LOG_RATIO_CLAMP
from learner.algorithms.objectives import PolicyBatch, PolicyObjective
from learner.algorithms.objectives.policy import _token_terms
from tests.learner.float_bounds import reorder_tol
from tests.learner.objective_inputs import opts, run, run_value

# (name, option overrides, whether advantages are per token)
VARIANTS: list[tuple[str, dict, bool]] = [
    ("gspo", {}, False),
    ("gspo_token", {}, False),
    ("gspo_token", {}, True),
    ("grpo", {"agg": "seq-mean-token-mean"}, False),
    ("grpo", {"agg": "token-mean"}, False),
    ("grpo", {"agg": "seq-mean-token-sum-norm", "max_len": 16}, False),
    ("ppo", {}, True),
]
IDS = [f"{n}-{kw.get('agg', '')}-{'tok' if tok else 'seq'}" for n, kw, tok in VARIANTS]


def _batch(
    lengths: list[int], prompt: list[int], width: int, seed: int, scale: float = 0.3
) -> dict[str, Tensor]:
    """Inputs of every objective; junk (including inf and nan) everywhere off the response."""
    gen = torch.Generator().manual_seed(seed)
    shape = (len(lengths), width)
    pos = torch.arange(width)[None, :]
    start, length = torch.tensor(prompt)[:, None], torch.tensor(lengths)[:, None]
    mask = (pos >= start) & (pos < start + length)
    lp = -3 * torch.rand(shape, generator=gen)
    junk = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e30, -5.0])
    filler = junk[torch.randint(0, 5, shape, generator=gen)]

    def near_lp() -> Tensor:  # another policy's log-probs: near lp's, and <= 0
        return (lp + scale * torch.randn(shape, generator=gen)).clamp(max=0.0)

    return {
        "logprobs": torch.where(mask, lp, -torch.rand(shape, generator=gen) * 1e4),
        "old": torch.where(mask, near_lp(), filler),
        "ref": torch.where(mask, near_lp(), filler),
        "weights": torch.where(mask, 2 * torch.rand(shape, generator=gen), filler),
        "token_adv": torch.where(mask, torch.randn(shape, generator=gen), filler),
        "adv": torch.randn(len(lengths), generator=gen),
        "mask": mask,
    }


def _settings(name: str, kwargs: dict, **more: object) -> tuple[object, int | None]:
    """(the arm's settings, the reducer's max_len): max_len is no arm setting."""
    settings = {key: value for key, value in kwargs.items() if key != "max_len"}
    return opts(name, **settings, **more), kwargs.get("max_len")


def _run(
    name: str, kwargs: dict, per_token: bool, b: dict[str, Tensor], extras: bool
) -> tuple[Tensor, Tensor, dict[str, float]]:
    logprobs = b["logprobs"].clone().requires_grad_()
    adv = b["token_adv"] if per_token else b["adv"]
    tensors = {"is_weights": b["weights"], "ref_logprobs": b["ref"]} if extras else {}
    options, max_len = _settings(name, kwargs, beta=0.05 if extras else 0.0)
    loss, stats = run(name, logprobs, b["old"], adv, b["mask"], options, max_len=max_len, **tensors)
    loss.backward()
    return loss.detach(), logprobs.grad, stats


def _pad(b: dict[str, Tensor], extra_cols: int, seed: int) -> dict[str, Tensor]:
    """Append junk columns (mask 0) and one empty row with a junk advantage."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, x in b.items():
        if key == "adv":
            out[key] = torch.cat([x, torch.tensor([123.0])])
            continue
        fill = torch.zeros if key == "mask" else torch.randn
        kw = {"dtype": torch.bool} if key == "mask" else {"generator": gen}
        wide = torch.cat([x, fill(x.shape[0], extra_cols, **kw) * (1 if key == "mask" else 50)], 1)
        out[key] = torch.cat([wide, fill(1, wide.shape[1], **kw) * (1 if key == "mask" else 50)])
    return out


CHAIN = 8
"""Roundings along one token's value (its log-ratio, clamp, exp, the clipped surrogate, IS
weight, KL estimate): a vectorised kernel and its scalar tail may round them differently, and
padding moves a token from one to the other."""


def _scale(b: dict[str, Tensor], per_token: bool) -> float:
    """A bound on the magnitude of every per-token term, gradient and statistic of `b`'s
    objectives: |A| max(r, 1 + eps) w for the surrogate (r = e^l, eps <= 1), e^|x| + |x| for
    each KL estimate (k1, k2 and k3 of x, and their derivatives) of the old and reference
    log-ratios, 1 for the clip fractions."""
    mask = b["mask"]
    if not mask.any():
        return 1.0
    adv = (b["token_adv"] if per_token else b["adv"][:, None].expand_as(mask))[mask].abs()
    ratio = (b["logprobs"] - b["old"])[mask].abs().clamp(max=LOG_RATIO_CLAMP)
    to_ref = (b["ref"] - b["logprobs"])[mask].abs().clamp(max=LOG_RATIO_CLAMP)
    weights = b["weights"][mask].clamp(min=1.0)
    surrogate = adv * ratio.exp().clamp(min=2.0) * weights
    kl = (ratio.exp() + ratio).max() + (to_ref.exp() + to_ref).max()
    return float(surrogate.max() + kl + 1.0)


def _assert_same(b: dict[str, Tensor], per_token: bool, base: tuple, padded: tuple) -> None:
    """The padded batch gives the same loss, gradient (and 0 off the batch) and stats: every
    one of them is a sum over the batch's tokens and rows (each row's sum, the rows' sum, or
    the tokens' mean) of per-token values each CHAIN roundings deep, the padding's zeros add
    nothing but may regroup the terms, so two orders differ by reorder_tol(n, scale)."""
    loss, grad, stats = base
    loss_p, grad_p, stats_p = padded
    rows, width = b["mask"].shape
    tol = reorder_tol(int(b["mask"].sum()) + rows + CHAIN, _scale(b, per_token))
    assert abs(loss_p.item() - loss.item()) <= tol
    torch.testing.assert_close(grad_p[:rows, :width], grad, rtol=0, atol=tol)
    assert torch.all(grad_p[:, width:] == 0) and torch.all(grad_p[rows:] == 0)
    assert stats_p.keys() == stats.keys()
    for key, value in stats.items():
        assert abs(stats_p[key] - value) <= tol, key


@pytest.mark.parametrize(("name", "kwargs", "per_token"), VARIANTS, ids=IDS)
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "weights+kl"])
def test_padding_changes_nothing(name: str, kwargs: dict, per_token: bool, extras: bool) -> None:
    b = _batch(lengths=[3, 1, 6, 0], prompt=[2, 4, 0, 1], width=8, seed=11)
    base = _run(name, kwargs, per_token, b, extras)
    padded = _run(name, kwargs, per_token, _pad(b, extra_cols=5, seed=12), extras)
    _assert_same(b, per_token, base, padded)
    assert all(math.isfinite(v) for v in base[2].values())


def test_value_loss_padding_changes_nothing() -> None:
    b = _batch(lengths=[3, 1, 6], prompt=[2, 4, 0], width=8, seed=2)
    values = b["logprobs"].clone().requires_grad_()
    loss, stats = run_value(values, b["old"], b["token_adv"], b["mask"])
    loss.backward()
    p = _pad(b, extra_cols=3, seed=4)
    values_p = p["logprobs"].clone().requires_grad_()
    loss_p, stats_p = run_value(values_p, p["old"], p["token_adv"], p["mask"])
    loss_p.backward()
    # Token means (and variances) over the tokens of terms (V - R)^2, (V_clip - R)^2, 2 (V - R),
    # V, R of magnitude <= scale, each a few roundings deep: reorder_tol(n, scale) apart.
    mask = b["mask"]
    largest = sum(float(b[k][mask].abs().max()) for k in ("logprobs", "old", "token_adv"))
    tol = reorder_tol(int(mask.sum()) + CHAIN, (largest + 1.0) ** 2)
    assert abs(loss_p.item() - loss.item()) <= tol
    torch.testing.assert_close(values_p.grad[:3, :8], values.grad, rtol=0, atol=tol)
    assert stats_p.keys() == stats.keys()
    for key, value in stats.items():
        # 1 - Var(R - V) / Var(R): each variance within tol, divided by Var(R).
        var_returns = float(b["token_adv"][mask].double().var(correction=0))
        scale = 2 / var_returns if key == M.VALUE_EXPLAINED_VAR else 1.0
        assert abs(stats_p[key] - value) <= tol * scale, key


@st.composite
def ragged(draw: Callable) -> tuple[list[int], list[int], int, int]:
    rows = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(0, 6), min_size=rows, max_size=rows))
    prompt = draw(st.lists(st.integers(0, 3), min_size=rows, max_size=rows))
    width = max(p + n for p, n in zip(prompt, lengths, strict=True)) + draw(st.integers(0, 3))
    return lengths, prompt, max(width, 1), draw(st.integers(0, 2**31 - 1))


@settings(max_examples=50, deadline=None)
@given(case=ragged(), variant=st.sampled_from(VARIANTS), extras=st.booleans())
def test_property_padding_invariance(case: tuple, variant: tuple, extras: bool) -> None:
    lengths, prompt, width, seed = case
    name, kwargs, per_token = variant
    b = _batch(lengths, prompt, width, seed)
    base = _run(name, kwargs, per_token, b, extras)
    padded = _run(name, kwargs, per_token, _pad(b, extra_cols=3, seed=seed + 1), extras)
    _assert_same(b, per_token, base, padded)


FLOAT32_MAX = float(torch.finfo(torch.float32).max)
# Realistic domains: a log-prob (policy, pi_old, reference) is a finite float32 <= 0; an
# advantage a finite float of any sign.
logprob = st.floats(-FLOAT32_MAX, 0.0, width=32)
advantage = st.floats(-1e6, 1e6)
EXTREMES = [(0.0, -FLOAT32_MAX, -FLOAT32_MAX, 1e6)] * 3 + [(-FLOAT32_MAX, 0.0, 0.0, -1e6)] * 3
"""The widest log-ratios a realistic input has: +-3.4e38, in both directions, and an empty row
beside a full one (the shape hypothesis once found gspo_token's NaN with, from a log-prob > 0)."""


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.tuples(logprob, logprob, logprob, advantage), min_size=6, max_size=6),
    lengths=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    variant=st.sampled_from(VARIANTS),
    estimator=st.sampled_from(["k1", "k2", "k3"]),
)
@example(values=EXTREMES, lengths=(0, 2), variant=VARIANTS[1], estimator="k1")
@example(values=EXTREMES, lengths=(3, 3), variant=VARIANTS[2], estimator="k2")
@example(values=EXTREMES, lengths=(3, 1), variant=VARIANTS[0], estimator="k3")
@example(values=EXTREMES, lengths=(2, 3), variant=VARIANTS[4], estimator="k3")
def test_property_finite_for_any_finite_input(
    values: list, lengths: tuple, variant: tuple, estimator: str
) -> None:
    name, kwargs, per_token = variant
    lp, old, ref, adv = (torch.tensor(col).view(2, 3) for col in zip(*values, strict=True))
    mask = torch.arange(3)[None, :] < torch.tensor(lengths)[:, None]
    logprobs = lp.clone().requires_grad_()
    options, max_len = _settings(name, kwargs, beta=0.1, kl_estimator=estimator)
    advantages = adv if per_token else adv[:, 0]
    loss, stats = run(
        name, logprobs, old, advantages, mask, options, ref_logprobs=ref, max_len=max_len
    )
    loss.backward()
    assert math.isfinite(loss.item())
    assert torch.isfinite(logprobs.grad).all()
    assert all(math.isfinite(v) for v in stats.values())


@PolicyObjective
def gspo_token_with_the_log_ratios_straight_through(batch: PolicyBatch, settings) -> object:
    """`gspo_token_loss` as it was: its straight-through term from l_t (NaN where l_t = lp - old
    overflows: a log-prob > 0), not from the log-probs themselves."""
    log_ratio, mask = batch.log_ratio, batch.mask
    clamped = log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    seq_log_ratio = clamped.sum(-1) / batch.lengths.clamp_min(1)
    seq_log_ratio_t = torch.where(mask, seq_log_ratio[:, None], 0.0)
    token_log_ratio = seq_log_ratio_t + (log_ratio - log_ratio.detach())
    return _token_terms(batch, token_log_ratio, settings, "seq-mean-token-mean")


def _gspo_token_both_ways(
    b: dict[str, Tensor], per_token: bool, extras: bool, dtype: torch.dtype
) -> list[tuple[Tensor, Tensor, dict[str, float]]]:
    results = []
    for objective in ("gspo_token", gspo_token_with_the_log_ratios_straight_through):
        logprobs = b["logprobs"].to(dtype, copy=True).requires_grad_()  # a leaf per call
        adv = b["token_adv"] if per_token else b["adv"]
        tensors = {"is_weights": b["weights"], "ref_logprobs": b["ref"]} if extras else {}
        options, _ = _settings("gspo_token", {}, beta=0.05 if extras else 0.0)
        loss, stats = run(objective, logprobs, b["old"], adv, b["mask"], options, **tensors)
        loss.backward()
        results.append((loss.detach(), logprobs.grad, stats))
    return results


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
@pytest.mark.parametrize("per_token", [False, True], ids=["seq", "tok"])
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "weights+kl"])
@pytest.mark.parametrize("seed", range(4))
def test_gspo_token_is_the_same_bit_for_bit_on_finite_input(
    seed: int, extras: bool, per_token: bool, dtype: torch.dtype
) -> None:
    """The straight-through term from the masked log-probs (exactly 0 for a finite log-prob,
    with l_t's gradient) changed no loss, gradient or stat of a finite input, bit for bit; the
    batch has junk (inf, nan) off the response, an empty row and off-policy tokens (clipped)."""
    b = _batch(lengths=[3, 1, 6, 0], prompt=[2, 4, 0, 1], width=8, seed=seed, scale=0.5)
    (loss, grad, stats), (loss_then, grad_then, stats_then) = _gspo_token_both_ways(
        b, per_token, extras, dtype
    )
    assert torch.equal(loss, loss_then) and torch.equal(grad, grad_then)
    assert stats == stats_then


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.tuples(logprob, logprob, logprob, advantage), min_size=6, max_size=6),
    lengths=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    per_token=st.booleans(),
)
@example(values=EXTREMES, lengths=(0, 2), per_token=False)
def test_property_gspo_token_is_the_same_bit_for_bit(
    values: list, lengths: tuple, per_token: bool
) -> None:
    lp, old, ref, adv = (torch.tensor(col).view(2, 3) for col in zip(*values, strict=True))
    mask = torch.arange(3)[None, :] < torch.tensor(lengths)[:, None]
    b = {"logprobs": lp, "old": old, "ref": ref, "weights": torch.ones_like(lp)}
    b |= {"token_adv": adv, "adv": adv[:, 0], "mask": mask}
    (loss, grad, stats), (loss_then, grad_then, stats_then) = _gspo_token_both_ways(
        b, per_token, True, torch.float32
    )
    assert torch.equal(loss, loss_then) and torch.equal(grad, grad_then)
    assert stats == stats_then


def test_gspo_token_stays_finite_where_the_log_ratio_overflows() -> None:
    """What hypothesis found with a log-prob > 0 (no policy gives one, but a corrupt input might):
    lp = 3.4e38 minus old = -1e31 overflows l_t to +inf, and l_t - sg[l_t] was inf - inf = NaN.
    From the log-probs themselves the straight-through term is 0: the loss and gradient stay
    finite (the ratio is clamped at e^20, as GSPO's)."""
    values = [(0.0, 0.0, 0.0, 0.0)] * 4 + [(FLOAT32_MAX, -1.0141204801825835e31, 0.0, 0.0)]
    values += [(0.0, 0.0, 0.0, 0.0)]
    lp, old, ref, adv = (torch.tensor(col).view(2, 3) for col in zip(*values, strict=True))
    b = {"logprobs": lp, "old": old, "ref": ref, "weights": torch.ones_like(lp)}
    b |= {
        "token_adv": adv,
        "adv": adv[:, 0],
        "mask": torch.tensor([[False] * 3, [True] * 2 + [False]]),
    }
    (loss, grad, stats), (loss_then, _, _) = _gspo_token_both_ways(b, False, True, torch.float32)
    assert math.isnan(loss_then.item())
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in stats.values())
