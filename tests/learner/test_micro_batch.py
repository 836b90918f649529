"""Micro-batches (gradient accumulation) give the whole minibatch's gradient, for every loss.

Each part's terms are reduced with the minibatch's totals (`LossTotals`, `reduce_loss`) instead of
its own counts, and Clip-Cov / KL-Cov take their token selection made on the whole minibatch
(`PolicyObjective.selection`), so the parts' gradients sum to the unsplit one; the parts' kept
terms, put back together, give the minibatch's metrics. The batch has an
uneven last micro-batch, a row longer than the budget (a micro-batch of its own) and an empty
response; the losses run off-policy (some tokens clipped), with IS weights and a reference-KL
penalty, so every term of every loss is split.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

import pytest
import torch
from torch import Tensor

from learner.algorithms.masking import LOSS_AGGREGATIONS, LossTotals
from learner.algorithms.objectives import (
    POLICY_LOSSES,
    PolicyBatch,
    PolicyTerms,
    policy_metrics,
    reduce_loss,
    value_loss,
)
from learner.algorithms.objectives.terms import LossTerms
from learner.config import ArmBase, make_arm
from learner.plugins import load_plugins
from learner.runtime.update import MicroBatch, assemble, micro_batches, take
from tests.learner.float_bounds import reorder_tol

# Prompt and response lengths of each row (row 4's response is empty): real tokens 8, 3, 13, 20,
# 3, 6, 5, 8. Budget 16 padded tokens: sorted longest first they pack as [20] (over the budget,
# alone), [13], [8, 8], [6, 5], [3, 3]: uneven parts, the last one 6 of 16 tokens.
PROMPTS = [3, 2, 4, 2, 3, 2, 3, 4]
RESPONSES = [5, 1, 9, 18, 0, 4, 2, 4]
BUDGET = 16
SETTINGS: dict[str, dict[str, object]] = {
    "clip_cov": {"clip_fraction": 0.2, "cov_low": -10.0, "cov_high": 10.0},
    "kl_cov": {"kl_fraction": 0.2},
}
ARMS = [("grpo", {"agg": agg}) for agg in LOSS_AGGREGATIONS]
ARMS += [(name, SETTINGS.get(name, {})) for name in POLICY_LOSSES if name != "grpo"]
PLUGIN = "examples/clipped_reinforce.py"


def minibatch(seed: int = 0) -> dict[str, Tensor]:
    """Right-padded [B, T] tensors laid out like a collated batch, junk off the response."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(PROMPTS) + torch.tensor(RESPONSES)  # (B,) real tokens
    width = int(lengths.max()) + 1  # one column of padding for every row
    positions = torch.arange(width)[None, :]  # (1, T)
    mask = (positions >= torch.tensor(PROMPTS)[:, None]) & (positions < lengths[:, None])
    shape = mask.shape

    def noise(scale: float) -> Tensor:
        return scale * torch.randn(shape, generator=gen)

    logprobs = -3 * torch.rand(shape, generator=gen)  # (B, T)
    return {
        "logprobs": logprobs,
        "old": logprobs + noise(0.3),  # off-policy: some ratios outside the clip range
        "ref": logprobs + noise(0.2),
        "is_weights": 0.5 + torch.rand(shape, generator=gen),
        "adv_seq": torch.randn(shape[0], generator=gen),
        "adv_tok": noise(1.0),
        "mask": mask,
        "lengths": lengths,
        "values": noise(1.0),
        "old_values": noise(1.0),
        "returns": noise(1.0),
    }


def parts_of(lengths: Tensor, ranks: int = 1) -> list[MicroBatch]:
    """Every rank's micro-batches of the whole batch (rows split into `ranks` equal shares)."""
    shares = torch.arange(lengths.numel()).reshape(ranks, -1)  # (W, b)
    return [part for rank in range(ranks) for part in micro_batches(shares, rank, lengths, BUDGET)]


def advantages_of(arm: ArmBase, b: dict[str, Tensor]) -> Tensor:
    return b["adv_seq"] if arm.advantages == "group" else torch.where(b["mask"], b["adv_tok"], 0)


def batch_of(
    b: dict[str, Tensor], logprobs: Tensor, adv: Tensor, rows: MicroBatch | None = None
) -> PolicyBatch:
    """The minibatch's checked batch, or its micro-batch `rows`'."""

    def cut(x: Tensor) -> Tensor:
        return x if rows is None else take(x, rows)

    return PolicyBatch.of(
        cut(logprobs),
        cut(b["old"]),
        cut(adv),
        cut(b["mask"]),
        is_weights=cut(b["is_weights"]),
        ref_logprobs=cut(b["ref"]),
    )


CHAIN = 8
"""Roundings along one token's term or gradient (its log-ratio, clamp, exp, the surrogate or
gate, IS weight, KL estimate, the count it is divided by): a part's tensors put a token in
another vector lane, or a kernel's scalar tail, where a transcendental may round otherwise."""


def magnitudes(loss: LossTerms) -> LossTerms:
    """The loss terms' magnitudes: reduced as the loss is, the sum of |what the loss sums|."""
    kl = None if loss.kl is None else loss.kl.detach().abs()
    return loss._replace(terms=loss.terms.detach().abs(), kl=kl, scale=abs(loss.scale))


class Split(NamedTuple):
    """The parts against the whole minibatch: the largest gradient and the loss difference, and
    the bound of each (float32 rounding of the same terms in another grouping)."""

    grad_diff: float
    loss_diff: float
    grad_tol: float
    loss_tol: float

    def holds(self) -> bool:
        return self.grad_diff <= self.grad_tol and self.loss_diff <= self.loss_tol


def split_gradient(name: str, settings: dict[str, object], ranks: int) -> Split:
    """The parts' loss and log-prob gradient against the whole minibatch's.

    Bounds (tests/learner/float_bounds.py): the loss sums the same per-token terms, each CHAIN
    roundings deep, over the minibatch's tokens and rows in another grouping, so the two differ
    by at most reorder_tol(n, S), n = tokens + rows + CHAIN and S the sum of the magnitudes of
    what is summed: the same reduction of |terms| (and |KL|). A token's gradient is its own
    term's derivative, a product chain of CHAIN roundings, through its row's sum of log-ratios
    for the sequence-ratio objectives (relative error of its exp: the sum's, <= gamma(T) max|l|),
    and the KL's exp(x) - 1 (an absolute u beta e^|x|): reorder_tol(CHAIN + T, G) with
    G = max|grad| (1 + max|l|) + beta e^max|x|."""
    b = minibatch()
    arm = make_arm(name="a", objective=name, beta=0.04, **settings)
    max_len = b["mask"].shape[1]
    adv = advantages_of(arm, b)
    objective = POLICY_LOSSES[name]

    whole = b["logprobs"].clone().requires_grad_()
    batch = batch_of(b, whole, adv)
    whole_terms = objective(batch, arm).loss
    whole_loss = reduce_loss(whole_terms, batch.lengths, max_len=max_len)
    whole_loss.backward()
    split = b["logprobs"].clone().requires_grad_()
    totals = LossTotals.of(b["mask"])
    selected = objective.selection(batch_of(b, b["logprobs"], adv), arm)
    split_loss = torch.zeros(())
    for part in parts_of(b["lengths"], ranks):
        batch = batch_of(b, split, adv, part)
        if selected is not None:
            batch = replace(batch, selected=take(selected, part))
        loss = reduce_loss(objective(batch, arm).loss, batch.lengths, totals, max_len)
        loss.backward()
        split_loss += loss.detach()
    assert whole.grad is not None and split.grad is not None
    assert whole.grad.abs().max() > 1e-3  # the comparison is not between two zeros
    mask, width = b["mask"], b["mask"].shape[1]
    loss_scale = float(reduce_loss(magnitudes(whole_terms), mask.sum(-1), max_len=max_len))
    n = int(mask.sum()) + mask.shape[0] + CHAIN
    log_ratio = float((b["logprobs"] - b["old"])[mask].abs().max())
    to_ref = float((b["ref"] - b["logprobs"])[mask].abs().max())
    grad_scale = float(whole.grad.abs().max()) * (1 + log_ratio) + arm.beta * math.exp(to_ref)
    return Split(
        grad_diff=float((whole.grad - split.grad).abs().max()),
        loss_diff=abs(float(whole_loss.detach()) - float(split_loss)),
        grad_tol=reorder_tol(CHAIN + width, grad_scale),
        loss_tol=reorder_tol(n, loss_scale),
    )


def test_the_batch_splits_unevenly_with_a_row_over_the_budget() -> None:
    lengths = minibatch()["lengths"]
    parts = parts_of(lengths)
    # Longest first: [20] alone (over the budget), [13] (13 + 8 rows-x-width would be 26), then
    # 2 x 8 = 16 fits, 3 x 8 = 24 not; 2 x 6 = 12, 3 x 6 = 18 not; the last part [3, 3].
    assert [lengths[p.rows].tolist() for p in parts] == [[20], [13], [8, 8], [6, 5], [3, 3]]
    assert [p.width for p in parts] == [20, 13, 8, 6, 3]
    assert sorted(torch.cat([p.rows for p in parts]).tolist()) == list(range(len(PROMPTS)))
    assert all(p.rows.numel() * p.width <= BUDGET for p in parts if p.rows.numel() > 1)


@pytest.mark.parametrize(("name", "settings"), ARMS, ids=[a[1].get("agg", a[0]) for a in ARMS])
def test_micro_batches_give_the_minibatch_gradient(name: str, settings: dict) -> None:
    split = split_gradient(name, settings, ranks=1)
    assert split.holds(), split


@pytest.mark.parametrize(("name", "settings"), ARMS, ids=[a[1].get("agg", a[0]) for a in ARMS])
def test_ranks_and_their_micro_batches_give_the_minibatch_gradient(name: str, settings) -> None:
    """Two data-parallel shares, each in micro-batches (the step scales by world size where DDP
    averages). Clip-Cov and KL-Cov select per rank, as without micro-batches: skipped."""
    if POLICY_LOSSES[name].select is not None:
        pytest.skip("selects tokens on each rank's share, not on the whole minibatch")
    split = split_gradient(name, settings, ranks=2)
    assert split.holds(), split


def test_a_plugin_objective_splits_exactly() -> None:
    (info,) = load_plugins([PLUGIN])
    (name,) = info.objectives
    split = split_gradient(name, {}, ranks=1)
    assert split.holds(), split


def test_value_loss_micro_batches_give_the_minibatch_gradient() -> None:
    b = minibatch()
    grads = []
    for parts in ([None], parts_of(b["lengths"])):
        values = b["values"].clone().requires_grad_()
        totals = None if parts == [None] else LossTotals.of(b["mask"])
        for part in parts:

            def cut(x: Tensor, part: MicroBatch | None = part) -> Tensor:
                return x if part is None else take(x, part)

            terms = value_loss(
                cut(values), cut(b["old_values"]), cut(b["returns"]), cut(b["mask"]), clip=0.2
            )
            loss = reduce_loss(terms.loss, cut(b["mask"]).sum(-1), totals)
            loss.backward()
        grads.append(values.grad)
    assert grads[0].abs().max() > 1e-3
    # Each value's gradient is its own token's 0.5 x 2 (V - R) (or V_clip's) over the token
    # count, a product chain of CHAIN roundings: reorder_tol(CHAIN, its magnitude) apart.
    tol = reorder_tol(CHAIN, float(grads[0].abs().max()))
    assert float((grads[0] - grads[1]).abs().max()) <= tol


def test_value_clip_frac_counts_only_values_outside_the_trust_region() -> None:
    """The first token is the one a learner step met (new packages moved a forward by a bit):
    V = 0.0025575075, V_old = 0.0001333, so V_old + (V - V_old) rounds one ulp above V, and the
    clipped error "won" with V well inside the region; the metric counted it as clipped in the
    unsplit minibatch but not in its micro-batches. The second token is really clipped: V moved
    0.5 towards its return, out of the 0.2 region, so (V_clip - R)^2 = 0.64 beats (V - R)^2 =
    0.25. The third moved 0.5 too, away from its return: the unclipped 0.81 wins, not clipped."""
    values = torch.tensor([[0.0025575074832886457, -0.5, 0.9]])
    old_values = torch.tensor([[0.00013329077046364546, 0.0, 0.4]])
    returns = torch.tensor([[0.0017554786754772067, -1.0, 0.0]])
    mask = torch.ones_like(values, dtype=torch.bool)
    clipped_v = old_values[0, 0] + (values[0, 0] - old_values[0, 0]).clamp(-0.2, 0.2)
    assert clipped_v != values[0, 0]  # the rounding this test is about
    terms = value_loss(values, old_values, returns, mask, clip=0.2)
    assert terms.stats.clipped.tolist() == [[0.0, 1.0, 0.0]]
    # The loss is unchanged: max of the two errors per token, rounding included.
    assert terms.loss.terms[0, 1:].tolist() == pytest.approx([0.64, 0.81])
    assert float(terms.loss.terms[0, 0]) == float((clipped_v - returns[0, 0]).square())


def test_totals_of_the_rows_themselves_change_nothing() -> None:
    """Unsplit terms reduced with their own totals are reduced without totals, bit for bit."""
    b = minibatch()
    max_len = b["mask"].shape[1]
    for name, settings in ARMS:
        arm = make_arm(name="a", objective=name, **settings)
        adv = b["adv_seq"] if arm.advantages == "group" else b["adv_tok"]
        batch = PolicyBatch.of(b["logprobs"], b["old"], adv, b["mask"])
        terms = POLICY_LOSSES[name](batch, arm)
        plain = reduce_loss(terms.loss, batch.lengths, max_len=max_len)
        given = reduce_loss(terms.loss, batch.lengths, LossTotals.of(b["mask"]), max_len)
        plain_stats = policy_metrics(terms, batch.mask, plain)
        given_stats = policy_metrics(terms, batch.mask, given)
        assert torch.equal(plain, given) and plain_stats == given_stats, name


@pytest.mark.parametrize(("name", "settings"), ARMS, ids=[a[1].get("agg", a[0]) for a in ARMS])
def test_the_parts_kept_terms_give_the_minibatch_metrics(name: str, settings: dict) -> None:
    """Each part's one call keeps its terms and stats; put back in the minibatch's rows they
    give the metrics of one call on the whole minibatch (up to rounding where a part sums a row
    or takes a transcendental at its own width): no call is made again for the stats."""
    b = minibatch()
    arm = make_arm(name="a", objective=name, beta=0.04, **settings)
    max_len, adv, objective = b["mask"].shape[1], advantages_of(arm, b), POLICY_LOSSES[name]
    batch = batch_of(b, b["logprobs"], adv)
    terms = objective(batch, arm)
    whole = policy_metrics(terms, batch.mask, reduce_loss(terms.loss, batch.lengths, None, max_len))
    selected = objective.selection(batch, arm)
    parts = parts_of(b["lengths"])
    kept: list[PolicyTerms] = []
    for part in parts:
        piece = batch_of(b, b["logprobs"], adv, part)
        if selected is not None:
            piece = replace(piece, selected=take(selected, part))
        kept.append(objective(piece, arm).detach())
    totals = LossTotals.of(b["mask"])
    shares = assemble(kept, parts, *batch.mask.shape)  # one share: positions are rows
    loss = reduce_loss(shares.loss, batch.lengths, totals, max_len)
    combined = policy_metrics(shares, batch.mask, loss)
    assert combined.keys() == whole.keys()
    # Each metric is a mean (or max, min) over the tokens and rows of per-token stats, each
    # CHAIN roundings deep: the loss's terms (|term| + beta |KL| <= its loss_scale), ratios and
    # KL estimates of the log-ratio l (<= e^|l| + |l|), 0/1 flags: reorder_tol(n, S) apart.
    mask = batch.mask
    log_ratio = (b["logprobs"] - b["old"])[mask].abs()
    loss_scale = float(reduce_loss(magnitudes(terms.loss), batch.lengths, None, max_len))
    scale = loss_scale + float((log_ratio.exp() + log_ratio).max()) + 1.0
    tol = reorder_tol(int(mask.sum()) + mask.shape[0] + CHAIN, scale)
    for key, value in whole.items():
        assert abs(combined[key] - value) <= tol, (key, combined[key], value, tol)


def test_ranks_get_as_many_micro_batches_each() -> None:
    """DDP broadcasts buffers in every forward: ranks must run equal numbers of forwards. The
    share with fewer parts halves its largest until the counts match, within the budget."""
    lengths = torch.tensor([20, 3, 3, 3, 3, 3, 3, 3])  # rank 0: [20], [3, 3, 3]; rank 1: [3 x 4]
    shares = torch.arange(8).reshape(2, 4)
    own = [micro_batches(shares, rank, lengths, 12) for rank in (0, 1)]
    assert [len(parts) for parts in own] == [2, 2]
    assert [p.rows.tolist() for p in own[1]] == [[4, 5], [6, 7]]
    for rank, parts in enumerate(own):
        assert sorted(torch.cat([p.rows for p in parts]).tolist()) == shares[rank].tolist()
        assert [p.local.tolist() for p in parts] == [(p.rows - 4 * rank).tolist() for p in parts]


def test_without_a_budget_the_share_is_one_part_at_full_width() -> None:
    shares = torch.arange(6).reshape(1, 6)
    (part,) = micro_batches(shares, 0, torch.full((6,), 5), None)
    assert part.rows.tolist() == list(range(6)) and part.width is None
