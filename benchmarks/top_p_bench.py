"""Cost of the learner's top-p mask (`learner.algorithms.sampling_dist._dropped`): old vs new.

**old** is vLLM's own way, `_dropped_by_sort`: torch.sort of the full vocabulary with indices,
softmax, float32 cumulative sum, scatter back (what `_dropped` did for every row until now).
**new** is `_dropped` itself: on CPU, a NumPy sort of the values alone, the same softmax and
cumulative sum on them, and the mask as `scaled < the first kept value`; only rows where equal
values straddle the nucleus boundary take torch.sort's order (their *fallback rate* below). Both
are timed interleaved (one repetition of each per round, order alternated each round, so machine
noise hits both alike; figures are medians) on the same [rows, V] scaled logits, and every mask
is checked equal bit for bit.

Logit kinds: `near_uniform` (a random-init head: 0.02 * N(0, 1)), `peaked` (3 * N(0, 1): a few
hundred tokens hold most mass at 32k), `zipf` (logit ~ -1.1 log rank + noise: a trained LM's
fall-off), each also rounded to bf16 (a bf16 model's logits: exact ties everywhere, so ties
straddle the boundary and the fallback fires).

`bound_ambiguous` is why the issue's suggested design (top-m candidates, cumulative mass from a
cheaper computation, a rigorous rounding bound) was not built: the reference's softmax divides
by a float32 sum of V exponentials whose order is its sorted order; with no assumption on that
order the sum is only known to relative (V-1)u/(1-(V-1)u), u = 2^-24 (1.95e-3 at V = 32768),
and that error scales every cumulative value alike. A row is counted when scaling all of its
cumulative values by a factor in 1 +- that bound (plus 2u for the reciprocal and the product)
moves one across 1 - top_p: any exact method that does not redo the sorted sum must fall back
there, so this is a lower bound on such a design's fallback rate.

    .venv/bin/python benchmarks/top_p_bench.py --quick

The last line printed is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from learner.algorithms.sampling_dist import (
    SamplingSettings,
    _boundary,
    _cumulative,
    _dropped,
    _dropped_by_sort,
)

KINDS = ("near_uniform", "peaked", "zipf", "near_uniform_bf16", "peaked_bf16", "zipf_bf16")
UNIT_ROUNDOFF = 2.0**-24
"""u of float32 (round to nearest)."""


def make_logits(kind: str, rows: int, vocab: int, seed: int = 0) -> Tensor:
    """(rows, vocab) float32 logits of one kind (module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(rows, vocab, generator=gen)  # (rows, V)
    if kind.startswith("near_uniform"):
        logits = 0.02 * noise
    elif kind.startswith("peaked"):
        logits = 3.0 * noise
    else:
        ranks = torch.rand(rows, vocab, generator=gen).argsort(-1).float() + 1.0  # (rows, V)
        logits = 8.0 - 1.1 * ranks.log() + 0.3 * noise
    return logits.bfloat16().float() if kind.endswith("bf16") else logits


def threshold_of(top_p: float) -> Tensor:
    """1 - top_p in float32, as `_dropped` compares."""
    return 1.0 - torch.tensor(top_p, dtype=torch.float32)


def fallback_rate(scaled: Tensor, top_k: int, top_p: float) -> float:
    """Share of rows `_dropped` sorts again with torch.sort (`_boundary` not exact)."""
    ascending = torch.from_numpy(np.sort(scaled.numpy(), axis=-1))  # (rows, V)
    _, exact = _boundary(ascending, *_cumulative(ascending, top_k), threshold_of(top_p))
    return 1.0 - exact.float().mean().item()


def bound_ambiguous_rate(scaled: Tensor, top_k: int, top_p: float) -> float:
    """Share of rows a rigorous-bound design must fall back on (module docstring)."""
    vocab = scaled.shape[-1]
    n = (vocab - 1) * UNIT_ROUNDOFF
    rho = n / (1 - n) + 2 * UNIT_ROUNDOFF
    ascending = scaled.sort(dim=-1).values  # (rows, V)
    cumulative = _cumulative(ascending, top_k)[1].double()  # (rows, V)
    threshold = float(threshold_of(top_p))
    dropped = (cumulative <= threshold).sum(-1, keepdim=True).clamp_max(vocab - 1)  # (rows, 1)
    below = cumulative.gather(-1, (dropped - 1).clamp_min(0))  # (rows, 1) last dropped
    at = cumulative.gather(-1, dropped)  # (rows, 1) first kept
    flips = ((dropped > 0) & (below * (1 + rho) > threshold)) | (at * (1 - rho) <= threshold)
    return flips.float().mean().item()


def time_pair(
    old: Callable[[], Tensor], new: Callable[[], Tensor], reps: int
) -> tuple[float, float]:
    """(old, new) median seconds, interleaved; the masks are checked equal once first."""
    if not torch.equal(old(), new()):
        raise AssertionError("the masks differ")
    times: dict[str, list[float]] = {"old": [], "new": []}
    for rep in range(reps):
        pair = [("old", old), ("new", new)]
        for name, fn in pair if rep % 2 == 0 else pair[::-1]:
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["old"]), statistics.median(times["new"])


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512, help="positions scored at once (B*T)")
    parser.add_argument("--vocab", type=int, default=32768, help="vocabulary (V)")
    parser.add_argument("--top-p", type=float, default=0.9, help="gsm8k_format_cpu's is 0.9")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--reps", type=int, default=7, help="interleaved rounds per case")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (learner default: 1)"
    )
    parser.add_argument("--quick", action="store_true", help="128 rows, 3 rounds; ~a minute")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.reps = 128, 3
    torch.set_num_threads(args.threads)
    sampling = SamplingSettings(args.temperature, args.top_p, args.top_k)
    top_k = args.top_k if 0 < args.top_k < args.vocab else 0
    threshold = threshold_of(args.top_p)

    cases: dict[str, dict[str, float]] = {}
    print(f"threads={args.threads} rows={args.rows} V={args.vocab} {sampling}")
    print(
        f"  {'logits':18s} {'old ms':>9s} {'new ms':>9s} {'old/new':>8s} {'fallback':>9s}", end=""
    )
    print(f" {'bound_ambiguous':>16s}")
    for kind in args.kinds:
        scaled = make_logits(kind, args.rows, args.vocab) / args.temperature  # (rows, V)
        old_s, new_s = time_pair(
            lambda s=scaled: _dropped_by_sort(s, top_k, threshold),
            lambda s=scaled: _dropped(s, sampling),
            args.reps,
        )
        case = {
            "old_ms": round(1e3 * old_s, 2),
            "new_ms": round(1e3 * new_s, 2),
            "old_over_new": round(old_s / new_s, 2),
            "fallback_rate": round(fallback_rate(scaled, top_k, args.top_p), 4),
            "bound_ambiguous": round(bound_ambiguous_rate(scaled, top_k, args.top_p), 4),
        }
        cases[kind] = case
        print(
            f"  {kind:18s} {case['old_ms']:9.1f} {case['new_ms']:9.1f} "
            f"{case['old_over_new']:8.2f} {case['fallback_rate']:9.3f} "
            f"{case['bound_ambiguous']:16.3f}"
        )
    headline: dict[str, object] = {
        "benchmark": "top_p_mask",
        "threads": args.threads,
        "rows": args.rows,
        "V": args.vocab,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "temperature": args.temperature,
        "rounds": args.reps,
        "cases": cases,
    }
    print(json.dumps(headline))
    return headline


if __name__ == "__main__":
    main()
