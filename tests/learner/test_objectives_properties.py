"""Padding invariance and finiteness of every objective, by example and by hypothesis."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

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
    return {
        "logprobs": torch.where(mask, lp, -torch.rand(shape, generator=gen) * 1e4),
        "old": torch.where(mask, lp + scale * torch.randn(shape, generator=gen), filler),
        "ref": torch.where(mask, lp + scale * torch.randn(shape, generator=gen), filler),
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


def _assert_same(base: tuple, padded: tuple, width: int, rows: int) -> None:
    loss, grad, stats = base
    loss_p, grad_p, stats_p = padded
    assert loss_p.item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(grad_p[:rows, :width], grad, rtol=1e-5, atol=1e-8)
    assert torch.all(grad_p[:, width:] == 0) and torch.all(grad_p[rows:] == 0)
    for key, value in stats.items():
        assert stats_p[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize(("name", "kwargs", "per_token"), VARIANTS, ids=IDS)
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "weights+kl"])
def test_padding_changes_nothing(name: str, kwargs: dict, per_token: bool, extras: bool) -> None:
    b = _batch(lengths=[3, 1, 6, 0], prompt=[2, 4, 0, 1], width=8, seed=11)
    base = _run(name, kwargs, per_token, b, extras)
    padded = _run(name, kwargs, per_token, _pad(b, extra_cols=5, seed=12), extras)
    _assert_same(base, padded, width=8, rows=4)
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
    assert loss_p.item() == pytest.approx(loss.item(), rel=1e-6)
    torch.testing.assert_close(values_p.grad[:3, :8], values.grad)
    assert stats_p == pytest.approx(stats, rel=1e-5)


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
    _assert_same(base, padded, width=width, rows=len(lengths))


finite = st.floats(allow_nan=False, allow_infinity=False, width=32)  # any finite float32


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(
        st.tuples(finite, finite, finite, st.floats(-1e6, 1e6)), min_size=6, max_size=6
    ),
    lengths=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    variant=st.sampled_from(VARIANTS),
    estimator=st.sampled_from(["k1", "k2", "k3"]),
)
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
