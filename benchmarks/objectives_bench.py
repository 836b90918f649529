"""Forward+backward cost of each policy objective against a masked token-mean NLL.

Both sides take the same [B, T] logprobs leaf tensor (requires grad) and the same response mask;
the baseline is -masked_mean(logprobs, mask), i.e. the loss-side cost of plain cross-entropy
training with the model excluded. Cases are timed interleaved (one repetition of every case per
round, order rotated each round) so machine noise hits all of them alike; figures are medians.
The objectives include their stats (the learner always asks for them).

    .venv/bin/python benchmarks/objectives_bench.py --quick

The last line printed is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from learner.advantages import group_advantages
from learner.arms import arm_spec
from learner.masking import masked_mean

TARGET_RATIO = 1.5
"""The objective's cost budget, as a multiple of the NLL baseline's."""


@dataclass(frozen=True)
class Inputs:
    """One synthetic batch: right-padded logprobs with a prompt prefix, ragged responses."""

    logprobs: Tensor  # (B, T) leaf, requires grad
    old_logprobs: Tensor  # (B, T)
    advantages: Tensor  # (B,)
    token_advantages: Tensor  # (B, T)
    mask: Tensor  # (B, T) bool
    max_len: int


def make_inputs(batch: int, seq_len: int, group_size: int = 8, seed: int = 0) -> Inputs:
    """Logprobs near a typical LM's (-3..0), old policy 0.05 nats away, 16-token prompts."""
    gen = torch.Generator().manual_seed(seed)
    logprobs = -3.0 * torch.rand(batch, seq_len, generator=gen)  # (B, T)
    old = logprobs + 0.05 * torch.randn(batch, seq_len, generator=gen)  # (B, T)
    prompt = 16
    lengths = torch.randint(1, seq_len - prompt + 1, (batch,), generator=gen)  # (B,)
    positions = torch.arange(seq_len)[None, :]  # (1, T)
    mask = (positions >= prompt) & (positions < prompt + lengths[:, None])  # (B, T)
    rewards = torch.randint(0, 2, (batch,), generator=gen).float()  # (B,)
    group_size = group_size if batch % group_size == 0 else 1
    return Inputs(
        logprobs=logprobs.requires_grad_(),
        old_logprobs=old,
        advantages=group_advantages(rewards, group_size),
        token_advantages=torch.randn(batch, seq_len, generator=gen),
        mask=mask,
        max_len=seq_len - prompt,
    )


def cases(x: Inputs) -> dict[str, Callable[[], Tensor]]:
    """Name -> closure returning the loss; 'nll' is the baseline."""
    lp, old, adv, mask = x.logprobs, x.old_logprobs, x.advantages, x.mask
    gspo, gspo_token, grpo, ppo = (arm_spec(n) for n in ("gspo", "gspo_token", "grpo", "ppo"))
    out: dict[str, Callable[[], Tensor]] = {
        "nll": lambda: -masked_mean(lp, mask),
        "gspo": lambda: gspo.loss(lp, old, adv, mask, gspo.default_options())[0],
        "gspo_token": lambda: gspo_token.loss(lp, old, adv, mask, gspo_token.default_options())[0],
        "ppo": lambda: ppo.loss(lp, old, x.token_advantages, mask, ppo.default_options())[0],
    }
    for agg in ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"):
        options = replace(grpo.default_options(x.max_len), agg=agg)
        out[f"grpo[{agg}]"] = lambda o=options: grpo.loss(lp, old, adv, mask, o)[0]
    return out


def time_once(fn: Callable[[], Tensor], leaf: Tensor) -> float:
    """Seconds for one forward + backward."""
    leaf.grad = None
    start = time.perf_counter()
    fn().backward()
    return time.perf_counter() - start


def run(batch: int, seq_len: int, reps: int, warmup: int) -> dict[str, list[float]]:
    """Interleaved timings: every round times every case once, in a rotated order."""
    x = make_inputs(batch, seq_len)
    named = list(cases(x).items())
    for _ in range(warmup):
        for _, fn in named:
            time_once(fn, x.logprobs)
    times: dict[str, list[float]] = {name: [] for name, _ in named}
    for rep in range(reps):
        shift = rep % len(named)
        for name, fn in named[shift:] + named[:shift]:
            times[name].append(time_once(fn, x.logprobs))
    return times


def summarise(times: dict[str, list[float]]) -> tuple[dict[str, float], dict[str, float]]:
    """(median ms per case, ratio of each objective's median to the baseline's)."""
    median_ms = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
    base = median_ms["nll"]
    ratios = {name: ms / base for name, ms in median_ms.items() if name != "nll"}
    return median_ms, ratios


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64, help="sequences per batch (B)")
    parser.add_argument("--seq-len", type=int, default=1024, help="padded length (T)")
    parser.add_argument("--reps", type=int, default=2000, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=20, help="untimed rounds first")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (learner default: 1)"
    )
    parser.add_argument("--quick", action="store_true", help="300 rounds; well under a minute")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.warmup = 300, 10
    torch.set_num_threads(args.threads)
    median_ms, ratios = summarise(run(args.batch, args.seq_len, args.reps, args.warmup))
    print(f"B={args.batch} T={args.seq_len} threads={args.threads} rounds={args.reps}")
    print(f"{'case':34s} {'median ms':>10s} {'x nll':>7s}")
    for name, ms in median_ms.items():
        print(f"{name:34s} {ms:10.3f} {ratios.get(name, 1.0):7.2f}")
    headline: dict[str, object] = {
        "benchmark": "objectives_fwd_bwd",
        "B": args.batch,
        "T": args.seq_len,
        "threads": args.threads,
        "rounds": args.reps,
        "baseline": "nll",
        "median_ms": {k: round(v, 4) for k, v in median_ms.items()},
        "ratio_vs_nll": {k: round(v, 3) for k, v in ratios.items()},
        "max_ratio": round(max(ratios.values()), 3),
        "target_ratio": TARGET_RATIO,
    }
    print(json.dumps(headline))
    return headline


if __name__ == "__main__":
    main()
