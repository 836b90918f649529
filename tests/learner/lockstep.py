"""Two configurations of the learner step compared update by update, in lockstep.

Comparing the weights at the end of several AdamW updates tells nothing about how micro-batching
(or another kernel) computes: AdamW divides each gradient coordinate by the root of its own
running square, so a coordinate whose gradient is near 0 moves its weight by up to ~lr whatever
the sign of a rounding error in it (a 1e-10 difference moved weights by 4e-6 on one CPU, by less
on another), and the next update starts from other weights. So the second run follows the
first: `Recorder` records, at every optimizer step of a run, the gradient each parameter
accumulated (and the parts it accumulated it from), the clipped gradient the optimizer stepped
with, and the weights and AdamW state before and after; with `follow`, after each of its own
steps it takes the followed run's weights and state, so every update of both runs starts from
the same weights, bit for bit. `check_lockstep` then bounds each update's difference by the
computation (tests/learner/float_bounds.py):

- gradients: each coordinate is a float32 sum over the minibatch's positions of per-token terms
  each computed through its forward and backward chain; two orders differ by at most
  `reorder_tol(n, S)`, n the summed lengths (positions + chains), S the terms' magnitude. S is
  taken per tensor (a normwise bound) as the largest sum over the micro-batches of the absolute
  values of their gradients, the magnitude the accumulation adds up (GRPO's zero-mean
  advantages make rows cancel, so |g| alone would understate it);
- the clipped gradient norm: |norm' - norm| <= ||g' - g||_2 + the two norms' own rounding;
- the weights: the gradient bound propagated through the clip factor and one AdamW step from the
  recorded state, per coordinate (`adamw_bound`), plus AdamW's own rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from contract import metrics as M
from learner.runtime.update import Optimised
from tests.learner.float_bounds import TERM_SCALE, U32, gamma, reorder_tol

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6)


@dataclass
class Update:
    """One optimizer step of one module: per parameter, in `module.parameters()` order."""

    grads: list[Tensor | None]  # accumulated over the micro-batches, before the clip
    scales: list[float]  # max over coordinates of sum over micro-batches of |part gradient|
    clipped: list[Tensor | None]  # what AdamW stepped with
    before: list[Tensor]
    state_before: list[dict[str, Tensor]]
    after: list[Tensor]
    state_after: list[dict[str, Tensor]]
    norm: float  # the clipped total norm, as clip_grad_norm_ computes it
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float


def _state(optimizer: torch.optim.Optimizer, param: Tensor) -> dict[str, Tensor]:
    return {key: value.clone() for key, value in optimizer.state.get(param, {}).items()}


class Recorder:
    """Records every optimizer step of `optimised` (see the module docstring); with `follow`,
    the updates of another run of the same steps, puts that run's weights and AdamW state in
    place after each step, so the next update starts where the followed run's did."""

    def __init__(self, optimised: Optimised, follow: list[Update] | None = None) -> None:
        self.optimizer = optimised.optimizer
        self.params = list(optimised.module.parameters())
        self.follow = follow
        self.updates: list[Update] = []
        self._snapshots: list[list[Tensor]] = [[] for _ in self.params]
        self._pending: dict | None = None
        self._handles = [
            param.register_post_accumulate_grad_hook(self._accumulated(k))
            for k, param in enumerate(self.params)
        ]
        self._handles += [
            self.optimizer.register_step_pre_hook(self._pre),
            self.optimizer.register_step_post_hook(self._post),
        ]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _accumulated(self, k: int):
        def hook(param: Tensor) -> None:
            assert param.grad is not None
            self._snapshots[k].append(param.grad.detach().clone())

        return hook

    def _pre(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        grads, scales = [], []
        for snapshots in self._snapshots:
            grads.append(snapshots[-1] if snapshots else None)
            magnitude, previous = None, None
            for snapshot in snapshots:  # each part's gradient: the difference it accumulated
                part = (snapshot if previous is None else snapshot - previous).abs()
                magnitude = part if magnitude is None else magnitude + part
                previous = snapshot
            scales.append(0.0 if magnitude is None else float(magnitude.max()))
            snapshots.clear()
        present = [g for g in grads if g is not None]
        norm = float(torch.nn.utils.get_total_norm(present)) if present else 0.0
        (group,) = optimizer.param_groups
        self._pending = {
            "grads": grads,
            "scales": scales,
            "clipped": [None if p.grad is None else p.grad.detach().clone() for p in self.params],
            "before": [p.detach().clone() for p in self.params],
            "state_before": [_state(optimizer, p) for p in self.params],
            "norm": norm,
            "lr": float(group["lr"]),
            "betas": tuple(group["betas"]),
            "eps": float(group["eps"]),
            "weight_decay": float(group["weight_decay"]),
        }

    def _post(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        assert self._pending is not None
        update = Update(
            after=[p.detach().clone() for p in self.params],
            state_after=[_state(optimizer, p) for p in self.params],
            **self._pending,
        )
        self._pending = None
        self.updates.append(update)
        if self.follow is None:
            return
        followed = self.follow[len(self.updates) - 1]
        with torch.no_grad():
            for param, weights, state in zip(
                self.params, followed.after, followed.state_after, strict=True
            ):
                param.copy_(weights)
                assert state.keys() == optimizer.state.get(param, {}).keys()
                for key, value in state.items():
                    optimizer.state[param][key].copy_(value)


@contextmanager
def recording(
    optimised: list[Optimised], follow: list[list[Update]] | None = None
) -> Iterator[list[Recorder]]:
    """A `Recorder` per module (policy, then the critic if any), following `follow`'s."""
    recorders = [
        Recorder(o, None if follow is None else follow[k]) for k, o in enumerate(optimised)
    ]
    try:
        yield recorders
    finally:
        for recorder in recorders:
            recorder.close()


def norm_rounding(tensors: list[Tensor]) -> float:
    """Relative bound on the rounding of `get_total_norm` (clip_grad_norm_'s): each tensor's
    norm is the root of a float32 sum of its P squares (gamma(P + 1), halved by the root, one
    more rounding), then the same over the tensors' norms."""
    largest = max((t.numel() for t in tensors), default=1)
    return (gamma(largest + 1) + gamma(len(tensors) + 1)) / 2 + 2 * U32


def adamw_bound(plain: Update, deltas: list[Tensor | None]) -> list[Tensor]:
    """Per coordinate, how far another run's weights after this AdamW step may be from
    `plain`'s, both stepping from `plain`'s weights and state (lockstep) with clipped gradients
    within `deltas` of each other.

    torch's AdamW: w <- w (1 - lr wd) - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps) with
    m = b1 m0 + (1 - b1) g, v = b2 v0 + (1 - b2) g^2, bc_i = 1 - b_i^t. With |g' - g| <= delta:
    |m' - m| <= (1 - b1) delta, and v, v' lie in [v_lo, v_hi] (g'^2 between (|g| - delta)_+^2
    and (|g| + delta)^2), so d = sqrt(v) / sqrt(bc2) + eps and d' lie in [d_lo, d_hi] and
    |m'/d' - m/d| <= |m' - m| / d_lo + |m| (1/d_lo - 1/d_hi). Near g = 0 this allows a sign
    flip, a move of up to ~lr: the bound follows the optimizer's state, coordinate by coordinate.
    Each run's own rounding of the step (m: 2, v: 3, the root, bias correction, eps, the
    division, the step size and the update: ~10 roundings of the update term, one of the
    weight) is added for both runs."""
    beta1, beta2 = plain.betas
    bounds = []
    for k, delta in enumerate(deltas):
        w = plain.after[k].double()
        g = plain.clipped[k]
        if g is None:  # no gradient: AdamW leaves the parameter (and its state) alone
            bounds.append(torch.zeros_like(w))
            continue
        assert delta is not None
        g, delta = g.double(), delta.double()
        t = float(plain.state_after[k]["step"])
        bc1, bc2 = 1 - beta1**t, 1 - beta2**t
        m0 = plain.state_before[k].get("exp_avg", torch.zeros_like(g)).double()
        v0 = plain.state_before[k].get("exp_avg_sq", torch.zeros_like(g)).double()
        m = beta1 * m0 + (1 - beta1) * g
        low, high = (g.abs() - delta).clamp_min(0.0), g.abs() + delta
        d_lo = (beta2 * v0 + (1 - beta2) * low.square()).sqrt() / math.sqrt(bc2) + plain.eps
        d_hi = (beta2 * v0 + (1 - beta2) * high.square()).sqrt() / math.sqrt(bc2) + plain.eps
        step = plain.lr / bc1
        moved = step * ((1 - beta1) * delta / d_lo + m.abs() * (1 / d_lo - 1 / d_hi))
        largest = step * m.abs() / d_lo + moved  # bounds either run's update term
        own = gamma(10) * largest + U32 * (w.abs() + largest)  # one run's rounding of its step
        bounds.append(moved + 2 * own)
    return bounds


def check_lockstep(
    plain: list[Update], other: list[Update], *, n: int, max_norm: float, what: str
) -> None:
    """`other` (which followed `plain`) took each update from `plain`'s weights and state, and
    its gradients, gradient norm and weights after the step are within the bounds of the
    module docstring: n is the summed reduction length of a gradient coordinate (0: the two
    runs compute the gradients in the same order, so they must be equal), max_norm the clip."""
    assert len(other) == len(plain), (what, len(other), len(plain))
    for step, (a, b) in enumerate(zip(plain, other, strict=True)):
        where = f"{what} update {step}"
        for x, y in zip(a.before, b.before, strict=True):
            assert torch.equal(x, y), where  # lockstep: the same weights...
        for x, y in zip(a.state_before, b.state_before, strict=True):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), where
        assert (a.lr, a.betas, a.eps, a.weight_decay) == (b.lr, b.betas, b.eps, b.weight_decay)
        # Gradients: per tensor, reorder_tol(n, S), S the magnitude of what was summed.
        deltas: list[float] = []
        for k, (g, h) in enumerate(zip(a.grads, b.grads, strict=True)):
            assert (g is None) == (h is None), (where, k)
            if g is None or h is None:
                deltas.append(0.0)
                continue
            bound = reorder_tol(n, max(a.scales[k], b.scales[k]))
            diff = float((g - h).abs().max())
            assert diff <= bound, f"{where}: gradient {k} differs by {diff:.3g} > {bound:.3g}"
            deltas.append(bound)
        # The total norm: ||g' - g||_2 <= sqrt(sum numel * delta^2), plus each norm's rounding.
        present = [g for g in a.grads if g is not None]
        grad_bound = math.sqrt(
            sum(g.numel() * d**2 for g, d in zip(a.grads, deltas, strict=True) if g is not None)
        )
        norm_bound = grad_bound + norm_rounding(present) * (a.norm + b.norm)
        assert abs(a.norm - b.norm) <= norm_bound, (where, a.norm, b.norm, norm_bound)
        # Clipped: g * c with c = min(1, max_norm / (norm + 1e-6)): exactly 1 in both runs
        # below the clip; else |dc/dnorm| <= 1 / (norm + 1e-6), and each run's c is rounded
        # twice (the sum, the quotient), its product with g once.
        clips = max(a.norm, b.norm) + CLIP_EPS > max_norm * (1 - 4 * U32)  # margin: c's rounding
        clip_moved = norm_bound / (min(a.norm, b.norm) + CLIP_EPS) + 4 * U32 if clips else 0.0
        clipped_deltas: list[Tensor | None] = []
        for k, (g, gc, hc) in enumerate(zip(a.grads, a.clipped, b.clipped, strict=True)):
            if g is None or gc is None or hc is None:
                assert gc is None and hc is None, (where, k)
                clipped_deltas.append(None)
                continue
            clipped_deltas.append(deltas[k] + clip_moved * g.abs() + U32 * (gc.abs() + hc.abs()))
        for k, (bound, x, y) in enumerate(
            zip(adamw_bound(a, clipped_deltas), a.after, b.after, strict=True)
        ):
            diff = (x.double() - y.double()).abs()
            worst = int((diff - bound).argmax())
            assert bool((diff <= bound).all()), (
                f"{where}: weight {k}[{worst}] moved {float(diff.flatten()[worst]):.3g} > "
                f"{float(bound.flatten()[worst]):.3g}"
            )


def check_step_metrics(
    split: list[dict[str, float]], whole: list[dict[str, float]], n: int
) -> None:
    """Each step's metrics of two orders agree within the bound of their computation: a metric
    is a mean (or max, min) over n summed terms of per-token values of the forward chain, of
    magnitude <= TERM_SCALE, so two orders differ by reorder_tol(n, TERM_SCALE + |value|).
    `perf/*` (the machine's) and NaN metrics must be NaN alike; the gradient norm is left to
    `check_lockstep`, which bounds the norms themselves."""
    for split_metrics, whole_metrics in zip(split, whole, strict=True):
        assert split_metrics.keys() == whole_metrics.keys()
        for key, value in whole_metrics.items():
            if key.startswith("perf/") or math.isnan(value):
                assert key.startswith("perf/") or math.isnan(split_metrics[key]), key
                continue
            if key == M.OPTIM_GRAD_NORM:  # the mean of the norms check_lockstep compared
                continue
            tol = reorder_tol(n, TERM_SCALE + abs(value))
            assert abs(split_metrics[key] - value) <= tol, (key, split_metrics[key], value, tol)
