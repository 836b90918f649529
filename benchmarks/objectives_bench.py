"""Forward+backward cost of each policy objective against a masked token-mean NLL.

Two measurements, each timed interleaved (one repetition of every case per round, order rotated
each round, so machine noise hits all cases alike; figures are medians):

- **from logits** (the headline, and the targets): every case starts from the same leaf logits
  [B, T, V] (V = 32k, a real vocabulary), takes log_softmax + gather of the sampled tokens, then
  applies its loss; the baseline's loss is the masked token-mean NLL. This is the objective's real
  share of an update's loss side: both sides pay the log_softmax, as a learner does.
- **loss only** (a diagnostic): the same losses on a [B, T] logprobs leaf, without the
  vocabulary. It isolates the objective's own elementwise work, which is where GSPO-token's
  extra cost over GSPO shows: GSPO reduces to one ratio per sequence [B] before clipping, while
  GSPO-token clips, weights and aggregates a full [B, T] tensor and computes the token ratios for
  its stats (about the work of GRPO), so at loss-only scale it costs a few times GSPO. From
  logits that difference is a few percent of the step.

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
from dataclasses import dataclass

import torch
from torch import Tensor

from learner.algorithms.advantages import group_advantages
from learner.algorithms.masking import masked_mean
from learner.algorithms.objectives import POLICY_LOSSES, PolicyBatch, reduce_loss
from learner.config import make_arm

TARGET_RATIO = 1.1
"""The objective's cost budget from logits, as a multiple of the NLL baseline's (issue 16)."""
TARGET_GSPO_TOKEN_VS_GSPO = 1.2
"""GSPO-token's budget from logits, as a multiple of GSPO's."""


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


ZOO = ("cispo", "sapo", "gmpo", "clip_cov", "kl_cov")
"""The objectives added after GSPO/GRPO/PPO (`learner.config.arms_zoo`)."""


def cases(x: Inputs, logprobs: Callable[[], Tensor]) -> dict[str, Callable[[], Tensor]]:
    """Name -> closure returning the loss; 'nll' is the baseline. `logprobs()` yields the [B, T]
    logprobs each case starts from (the leaf itself, or log_softmax + gather of leaf logits)."""
    old, adv, mask = x.old_logprobs, x.advantages, x.mask

    def loss(name: str, advantages: Tensor, **settings: object) -> Callable[[], Tensor]:
        """The objective's one call and the update's reducer, at the arm's settings."""
        arm = make_arm(name=name, objective=name, **settings)

        def call() -> Tensor:
            batch = PolicyBatch.of(logprobs(), old, advantages, mask)
            terms = POLICY_LOSSES[name](batch, arm)
            return reduce_loss(terms.loss, batch.lengths, max_len=x.max_len)

        return call

    out: dict[str, Callable[[], Tensor]] = {
        "nll": lambda: -masked_mean(logprobs(), mask),
        "gspo": loss("gspo", adv),
        "gspo_token": loss("gspo_token", adv),
        "ppo": loss("ppo", x.token_advantages),
    }
    for name in ZOO:  # sequence-level advantages, paper defaults
        out[name] = loss(name, adv)
    for agg in ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"):
        out[f"grpo[{agg}]"] = loss("grpo", adv, agg=agg)
    return out


@dataclass(frozen=True)
class Logits:
    """Leaf logits [B, T, V] and the sampled tokens [B, T, 1] whose logprobs the cases take."""

    logits: Tensor
    targets: Tensor

    def logprobs(self) -> Tensor:
        """log_softmax + gather: what every update pays before its loss
        (learner.runtime.forward)."""
        return torch.log_softmax(self.logits, dim=-1).gather(-1, self.targets).squeeze(-1)


def make_logits(batch: int, seq_len: int, vocab: int, seed: int = 1) -> Logits:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, seq_len, vocab, generator=gen)  # (B, T, V)
    targets = torch.randint(0, vocab, (batch, seq_len, 1), generator=gen)  # (B, T, 1)
    return Logits(logits.requires_grad_(), targets)


def time_once(fn: Callable[[], Tensor], leaf: Tensor) -> float:
    """Seconds for one forward + backward."""
    leaf.grad = None
    start = time.perf_counter()
    fn().backward()
    return time.perf_counter() - start


def run(
    named: list[tuple[str, Callable[[], Tensor]]], leaf: Tensor, reps: int, warmup: int
) -> dict[str, list[float]]:
    """Interleaved timings: every round times every case once, in a rotated order."""
    for _ in range(warmup):
        for _, fn in named:
            time_once(fn, leaf)
    times: dict[str, list[float]] = {name: [] for name, _ in named}
    for rep in range(reps):
        shift = rep % len(named)
        for name, fn in named[shift:] + named[:shift]:
            times[name].append(time_once(fn, leaf))
    return times


def summarise(times: dict[str, list[float]]) -> tuple[dict[str, float], dict[str, float]]:
    """(median ms per case, ratio of each objective's median to the baseline's)."""
    median_ms = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
    base = median_ms["nll"]
    ratios = {name: ms / base for name, ms in median_ms.items() if name != "nll"}
    return median_ms, ratios


def print_table(title: str, median_ms: dict[str, float], ratios: dict[str, float]) -> None:
    print(title)
    print(f"  {'case':34s} {'median ms':>10s} {'x nll':>7s} {'x gspo':>7s}")
    for name, ms in median_ms.items():
        vs_gspo = ms / median_ms["gspo"]
        print(f"  {name:34s} {ms:10.3f} {ratios.get(name, 1.0):7.3f} {vs_gspo:7.3f}")


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="sequences per batch (B), logits")
    parser.add_argument("--seq-len", type=int, default=512, help="padded length (T), logits")
    parser.add_argument("--vocab", type=int, default=32768, help="vocabulary (V), logits")
    parser.add_argument("--reps", type=int, default=60, help="interleaved rounds, logits")
    parser.add_argument("--loss-batch", type=int, default=64, help="B of the loss-only run")
    parser.add_argument("--loss-seq-len", type=int, default=1024, help="T of the loss-only run")
    parser.add_argument("--loss-reps", type=int, default=2000, help="rounds of the loss-only run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (learner default: 1)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds; about a minute")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.seq_len, args.reps, args.loss_reps = 8, 256, 20, 300
    torch.set_num_threads(args.threads)

    x = make_inputs(args.batch, args.seq_len)
    leaf = make_logits(args.batch, args.seq_len, args.vocab)
    logit_ms, logit_ratios = summarise(
        run(list(cases(x, leaf.logprobs).items()), leaf.logits, args.reps, args.warmup)
    )
    y = make_inputs(args.loss_batch, args.loss_seq_len)
    loss_ms, loss_ratios = summarise(
        run(list(cases(y, lambda: y.logprobs).items()), y.logprobs, args.loss_reps, args.warmup)
    )
    print(f"threads={args.threads}")
    print_table(
        f"from logits: B={args.batch} T={args.seq_len} V={args.vocab}, {args.reps} rounds",
        logit_ms,
        logit_ratios,
    )
    print_table(
        f"loss only: B={args.loss_batch} T={args.loss_seq_len}, {args.loss_reps} rounds",
        loss_ms,
        loss_ratios,
    )
    max_ratio = max(logit_ratios.values())
    token_vs_seq = logit_ms["gspo_token"] / logit_ms["gspo"]
    headline: dict[str, object] = {
        "benchmark": "objectives_fwd_bwd",
        "threads": args.threads,
        "baseline": "log_softmax + gather + masked NLL",
        "from_logits": {
            "B": args.batch,
            "T": args.seq_len,
            "V": args.vocab,
            "rounds": args.reps,
            "median_ms": {k: round(v, 3) for k, v in logit_ms.items()},
            "ratio_vs_nll": {k: round(v, 3) for k, v in logit_ratios.items()},
            "max_ratio": round(max_ratio, 3),
            "gspo_token_vs_gspo": round(token_vs_seq, 3),
        },
        "loss_only": {
            "B": args.loss_batch,
            "T": args.loss_seq_len,
            "rounds": args.loss_reps,
            "median_ms": {k: round(v, 4) for k, v in loss_ms.items()},
            "ratio_vs_nll": {k: round(v, 3) for k, v in loss_ratios.items()},
            "gspo_token_vs_gspo": round(loss_ms["gspo_token"] / loss_ms["gspo"], 3),
        },
        "targets": {
            f"max_ratio<={TARGET_RATIO}": max_ratio <= TARGET_RATIO,
            f"gspo_token_vs_gspo<={TARGET_GSPO_TOKEN_VS_GSPO}": token_vs_seq
            <= TARGET_GSPO_TOKEN_VS_GSPO,
        },
    }
    print(json.dumps(headline))
    return headline


if __name__ == "__main__":
    main()
