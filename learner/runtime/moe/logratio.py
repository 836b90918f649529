"""How much of the token log-ratio's spread routing explains, per step of an MoE trial.

The GSPO paper's argument (Zheng et al. 2025, arXiv:2507.18071, sec. 5.3) is that in an MoE
policy the token ratio pi_theta(y_t) / pi_old(y_t) is volatile because the update re-routes
tokens: numerator and denominator come from different sub-networks. `moe/routing_change_frac`
and `moe/token_rerouted_frac` count the re-routing; these metrics weigh what it does to the
ratio. After the step's updates, at the current weights theta, over the step's response tokens
t (the objectives' masked token set, `RolloutBatch.response_mask`):

    a_t = log pi_theta(y_t) - log pi_old(y_t)   the routers free (their current choice),
    b_t = log pi_theta(y_t) - log pi_old(y_t)   pi_old's experts replayed in every layer,

with log pi_old the learner's start-of-step log-probs (the step's pi_old pass, whatever the
arm's off-policy correction trains against: the behaviour log-probs would add the engine gap
and staleness, which no routing replay removes) and "pi_old's experts" the ones those
log-probs were computed on: the learner's own start-of-step routing (the capture that
`routing_replay: old` replays), or under `routing_replay: rollout` the generator's experts,
which its pi_old pass replays. b_t is then the log-ratio at fixed routing (weights alone moved
it), and

    c_t = a_t - b_t = log pi_theta^free(y_t) - log pi_theta^replayed(y_t)

the part of the log-ratio that only routing moves; log pi_old cancels in it. Reported:
`moe/logratio_var` = Var_t(a_t), `moe/routing_logratio_var` = Var_t(c_t) and
`moe/routing_logratio_var_frac` = min(1, Var(c) / Var(a)), population variances over the
tokens (divide by n).

Why Var(c) / Var(a) and not 1 - Var(b) / Var(a): the latter is a difference of two nearly equal
numbers whenever routing explains little (the usual case), so it carries the rounding and
sampling noise of both variances and goes negative when b happens to spread more than a; c is
measured directly, is exactly 0 at every token when no router changed its choice (replaying a
router's own choice is bitwise its forward, `hooks.replayed_scores`), so the share is
exactly 0 then, and it is >= 0 by construction. It can exceed 1 when routing's part
anti-correlates with the weights' (Var(a) = Var(b) + Var(c) + 2 Cov(b, c) < Var(c)), which is
why the share is clipped and Var(c) is logged beside it unclipped. When Var(a) = 0 (no
log-ratio varies, e.g. an update that changed nothing) routing explains none of it: the share
is 0 if Var(c) = 0 too, else 1 (the clip of c / 0); NaN when no response token is scored.

Split invariance: a step computes a and b micro-batch by micro-batch (`learner.micro_batch_tokens`)
and adds each part's float64 count, sums and sums of squares (`LogRatioTally`), reducing only
at the end, so a split gives the whole batch's value up to float64 rounding of the sums (and
float32 rounding of the per-token log-probs, which a part's forward rounds its own way). The
sums' cancellation error, about 1e-16 x mean^2 / variance relative, is negligible for
log-ratios, whose mean is not orders of magnitude above their spread.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from contract import metrics as M

LOGRATIO_METRICS = (M.MOE_LOGRATIO_VAR, M.MOE_ROUTING_LOGRATIO_VAR, M.MOE_ROUTING_LOGRATIO_VAR_FRAC)


def logratio_sums(free: Tensor, replayed: Tensor, mask: Tensor) -> Tensor:
    """(n, sum a, sum a^2, sum c, sum c^2) float64 [5] over the masked tokens, with a = `free`
    and c = `free` - `replayed` (the log-ratios a_t and b_t [B, L], mask [B, L]); sums of
    disjoint token sets add up to the union's."""
    kept = mask.bool()
    a = free[kept].double()  # (n,)
    c = a - replayed[kept].double()  # (n,): the part routing moves
    n = torch.tensor(float(a.numel()), dtype=torch.float64, device=a.device)
    return torch.stack([n, a.sum(), (a * a).sum(), c.sum(), (c * c).sum()])


def variance_of_sums(n: float, total: float, squares: float) -> float:
    """Population variance (divide by n) from a count, sum and sum of squares; NaN for n = 0.
    Clamped at 0: rounding may leave sum x^2 - (sum x)^2 / n a hair below it."""
    if n == 0:
        return math.nan
    return max(0.0, (squares - total * total / n) / n)


def routing_variance_share(total: float, routing: float) -> float:
    """min(1, routing / total): the share of the log-ratio's variance `total` = Var(a) that
    routing's part `routing` = Var(a - b) makes up (module docstring). Var(a) = 0: 0 when
    Var(a - b) = 0 too (nothing varies, nothing to explain), else 1; NaN in, NaN out."""
    if math.isnan(total) or math.isnan(routing):
        return math.nan
    if total == 0:
        return 0.0 if routing == 0 else 1.0
    return min(1.0, routing / total)


def logratio_metrics(sums: Tensor) -> dict[str, float]:
    """`LOGRATIO_METRICS` from `logratio_sums` (of one part, or added over parts)."""
    n, sum_a, squares_a, sum_c, squares_c = sums.tolist()
    total = variance_of_sums(n, sum_a, squares_a)
    routing = variance_of_sums(n, sum_c, squares_c)
    return {
        M.MOE_LOGRATIO_VAR: total,
        M.MOE_ROUTING_LOGRATIO_VAR: routing,
        M.MOE_ROUTING_LOGRATIO_VAR_FRAC: routing_variance_share(total, routing),
    }


class LogRatioTally:
    """`logratio_sums` added up one micro-batch part at a time (`add`), reduced at the end
    (`metrics`): any split of the batch gives the whole batch's sums up to float64 rounding."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(5, dtype=torch.float64, device=device)

    def add(self, free: Tensor, replayed: Tensor, mask: Tensor) -> None:
        """A part's log-ratios a_t (`free`) and b_t (`replayed`) [b, w], its response mask."""
        self.sums += logratio_sums(free, replayed, mask).to(self.sums.device)

    def metrics(self) -> dict[str, float]:
        return logratio_metrics(self.sums)
