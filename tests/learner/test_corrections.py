"""Off-policy corrections (learner.algorithms.corrections): hand-worked weights, masks at their
thresholds, ESS, and what they change in a real learner step."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

from buffer.collate import collate
from contract import metrics as M
from learner.algorithms.correction_spec import CORRECTIONS, correction_spec
from learner.algorithms.corrections import correction_weights
from learner.algorithms.objectives import POLICY_LOSSES
from learner.config import (
    ArmBase,
    EquivalentArmsWarning,
    LearnerConfig,
    make_arm,
    warn_equivalent_arms,
)
from learner.runtime.forward import policy_logprobs, scoring
from learner.runtime.models import build_step_models
from learner.runtime.step import train_on_batch
from tests.learner.objective_inputs import run
from tests.learner.tiny import random_groups, save_tiny_policy

# Two sequences: row 0 has three response tokens with rho = [2, 0.5, 4], row 1 two with
# rho = [1, 3] and one padded slot. Behaviour logprobs are 0, so log rho is exactly the float32
# proximal logprob and a ratio equal to a threshold compares equal in log space.
RHO = [[2.0, 0.5, 4.0], [1.0, 3.0, 1.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float32)
PROXIMAL = torch.log(torch.tensor(RHO))
BEHAVIOR = torch.zeros(2, 3)


def weights_of(kind: str, cap: float | None = None, low: float | None = None):
    spec = correction_spec(kind, cap, low)  # type: ignore[arg-type]
    return correction_weights(spec, PROXIMAL, BEHAVIOR, MASK)


def ess(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def as_rows(weights: torch.Tensor) -> list[torch.Tensor]:
    return list(weights * MASK)


@pytest.mark.parametrize("kind", ["naive", "proximal"])
def test_unweighted_corrections_report_the_ess_of_the_raw_ratios(kind: str) -> None:
    weights, stats = weights_of(kind)
    assert weights is None
    assert math.isnan(stats["weight_mean"])
    assert stats["ess_frac"] == pytest.approx(ess([2, 0.5, 4, 1, 3]), rel=1e-6)  # 0.728926
    assert stats["masked_frac"] == 0.0 and stats["trunc_frac"] == 0.0


@pytest.mark.parametrize(
    "case",
    [
        # decoupled: rho itself; a cap masks tokens above it (AReaL), 3 exactly is kept.
        ("decoupled", None, None, [[2, 0.5, 4], [1, 3, 0]], 0.0, 0.0, [2, 0.5, 4, 1, 3]),
        ("decoupled", 3.0, None, [[2, 0.5, 0], [1, 3, 0]], 0.2, 0.0, [2, 0.5, 0, 1, 3]),
        # tis_token: min(rho, 2); rho = 2 exactly is not counted as truncated.
        ("tis_token", None, None, [[2, 0.5, 2], [1, 2, 0]], 0.0, 0.4, [2, 0.5, 2, 1, 2]),
        # tis_seq: rho_seq = 4 and 3, truncated at 2 (every token) or kept under cap 5.
        ("tis_seq", None, None, [[2, 2, 2], [2, 2, 0]], 0.0, 1.0, [2, 2]),
        ("tis_seq", 5.0, None, [[4, 4, 4], [3, 3, 0]], 0.0, 0.0, [4, 3]),
        # mis_token: rho kept up to 2 inclusive, 0 above.
        ("mis_token", None, None, [[2, 0.5, 0], [1, 0, 0]], 0.4, 0.0, [2, 0.5, 0, 1, 0]),
        # mis_seq at 3 exactly: row 1 (rho_seq = 3) kept, row 0 (4) masked.
        ("mis_seq", 3.0, None, [[0, 0, 0], [3, 3, 0]], 0.6, 0.0, [0, 3]),
        # mis_geo: rho_geo = 4^(1/3) = 1.587 and sqrt(3) = 1.732: both in [0.5, 2], weight 1 ...
        ("mis_geo", None, None, [[1, 1, 1], [1, 1, 0]], 0.0, 0.0, [1, 1]),
        # ... and under cap 1.6 only row 0 survives.
        ("mis_geo", 1.6, None, [[1, 1, 1], [0, 0, 0]], 0.4, 0.0, [1, 0]),
        # icepop: two-sided; all rho in [0.5, 5] ...
        ("icepop", None, None, [[2, 0.5, 4], [1, 3, 0]], 0.0, 0.0, [2, 0.5, 4, 1, 3]),
        # ... with low = 1, rho = 0.5 is masked and rho = 1 (at the bound) kept.
        ("icepop", None, 1.0, [[2, 0, 4], [1, 3, 0]], 0.2, 0.0, [2, 0, 4, 1, 3]),
    ],
)
def test_hand_worked_weights(case: tuple) -> None:
    """case: (correction, cap, low, weights per row, masked, truncated, ESS units)."""
    kind, cap, low, rows, masked, truncated, ess_units = case
    weights, stats = weights_of(kind, cap, low)
    assert weights is not None and not weights.requires_grad
    flat = [w for row in rows for w in row]
    assert torch.cat(as_rows(weights)).tolist() == pytest.approx(flat, rel=1e-6)
    assert weights[1, 2] == 0.0  # padding carries no weight
    tokens = [
        w
        for row, m in zip(rows, MASK.tolist(), strict=True)
        for w, k in zip(row, m, strict=True)
        if k
    ]
    assert stats["weight_mean"] == pytest.approx(sum(tokens) / 5, rel=1e-6)
    assert stats["masked_frac"] == pytest.approx(masked, abs=1e-7)
    assert stats["trunc_frac"] == pytest.approx(truncated, abs=1e-7)
    assert stats["ess_frac"] == pytest.approx(ess(ess_units), rel=1e-6)


def test_every_weight_masked_gives_ess_zero() -> None:
    _, stats = weights_of("mis_seq", 1.5)  # rho_seq 4 and 3 both above 1.5
    assert stats["ess_frac"] == 0.0 and stats["masked_frac"] == 1.0


@pytest.mark.parametrize("kind", CORRECTIONS)
def test_identical_policies_give_weight_one_no_mask_and_full_ess(kind: str) -> None:
    logprobs = torch.tensor([[-0.3, -2.0, -1.1], [-0.7, -0.2, 0.0]])
    spec = correction_spec(kind)  # type: ignore[arg-type]
    weights, stats = correction_weights(spec, logprobs, logprobs.clone(), MASK)
    if kind in ("naive", "proximal"):
        assert weights is None
    else:
        assert torch.equal(weights, MASK)
        assert stats["weight_mean"] == 1.0
    assert stats["ess_frac"] == pytest.approx(1.0, abs=1e-12)
    assert stats["masked_frac"] == 0.0 and stats["trunc_frac"] == 0.0


def test_bounds_are_validated_and_defaults_follow_learner_old_logprobs() -> None:
    with pytest.raises(ValueError, match="correction_cap/correction_low without a correction"):
        make_arm(name="a", objective="grpo", correction_cap=2.0)
    with pytest.raises(ValueError, match="low < cap"):
        make_arm(name="a", objective="grpo", correction="icepop", correction_low=6.0)
    plain = make_arm(name="a", objective="grpo")
    assert plain.correction_for(LearnerConfig()).kind == "naive"
    recompute = plain.correction_for(LearnerConfig(old_logprobs="recompute", is_cap=3.0))
    assert (recompute.kind, recompute.cap) == ("tis_token", 3.0)
    own = make_arm(name="a", objective="grpo", correction="mis_geo", correction_cap=1.5)
    assert own.correction_for(LearnerConfig(old_logprobs="recompute")) == correction_spec(
        "mis_geo", 1.5, 0.5
    )


def test_gspo_token_equals_gspo_under_sequence_level_corrections_only() -> None:
    learner = LearnerConfig()

    def arms(correction: str) -> list[ArmBase]:
        return [
            make_arm(name="g", objective="gspo", correction=correction),
            make_arm(name="gt", objective="gspo_token", correction=correction),
        ]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EquivalentArmsWarning)
        assert len(warn_equivalent_arms(arms("tis_seq"), learner)) == 1
        assert len(warn_equivalent_arms(arms("naive"), learner)) == 1
        assert len(warn_equivalent_arms(arms("proximal"), learner)) == 1  # no weights either
        assert warn_equivalent_arms(arms("tis_token"), learner) == []


GROUP_SIZE = 4


def _step(tmp_path, correction: str, batch):
    arm = make_arm(name=correction, objective="grpo", correction=correction)
    cfg = LearnerConfig(prompts_per_step=2, minibatches=2, lr=1e-2)
    torch.manual_seed(0)
    models = build_step_models(save_tiny_policy(tmp_path / correction), arm, cfg, total_steps=1)
    result = train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=0
    )
    return result.metrics, [p.detach().clone() for p in models.policy.module.parameters()]


def _on_policy_and_stale(tmp_path):
    """One batch twice: behaviour logprobs equal to the learner's own (on-policy), and 0.3
    lower on every response token (stale: rho = exp(0.3) everywhere)."""
    model_dir = save_tiny_policy(tmp_path / "scorer")
    scorer = build_step_models(
        model_dir, make_arm(name="s", objective="grpo"), LearnerConfig(prompts_per_step=2), 1
    ).policy.module
    batch = collate(random_groups(2, GROUP_SIZE, seed=5), pad_id=0)
    with scoring(scorer):
        learner_lp, _ = policy_logprobs(scorer, batch.input_ids, batch.attention_mask)
    mask = batch.response_mask
    on_policy = dataclasses.replace(batch, behavior_logprobs=learner_lp * mask)
    stale = dataclasses.replace(batch, behavior_logprobs=(learner_lp - 0.3 * mask) * mask)
    return on_policy, stale


def test_naive_and_decoupled_differ_exactly_when_pi_old_differs_from_behaviour(tmp_path) -> None:
    on_policy, stale = _on_policy_and_stale(tmp_path)

    naive, naive_params = _step(tmp_path / "a", "naive", on_policy)
    decoupled, decoupled_params = _step(tmp_path / "b", "decoupled", on_policy)
    assert naive[M.POLICY_LOSS] == decoupled[M.POLICY_LOSS]
    assert all(torch.equal(a, b) for a, b in zip(naive_params, decoupled_params, strict=True))
    assert decoupled[M.OFFPOLICY_WEIGHT_MEAN] == 1.0

    naive, naive_params = _step(tmp_path / "c", "naive", stale)
    decoupled, decoupled_params = _step(tmp_path / "d", "decoupled", stale)
    # naive's ratio carries the gap: r = exp(0.3) on every token of the first minibatch;
    # decoupled's ratio starts at 1 and its weight rho = pi_prox / mu = exp(0.3) carries it.
    assert naive[M.POLICY_RATIO_MAX] > 1.3
    assert decoupled[M.OFFPOLICY_WEIGHT_MEAN] == pytest.approx(math.exp(0.3), rel=1e-5)
    assert naive[M.POLICY_LOSS] != decoupled[M.POLICY_LOSS]
    assert any(not torch.equal(a, b) for a, b in zip(naive_params, decoupled_params, strict=True))


def test_proximal_centres_on_the_recompute_without_weighting_by_the_behaviour(tmp_path) -> None:
    """AReaL's current default: pi_old = pi_prox like `decoupled`, but no weight pi_prox / mu.
    On-policy data it is `decoupled` bit for bit (every rho is 1); on stale data it differs from
    both `naive` (whose ratio carries the gap) and `decoupled` (whose weight does)."""
    on_policy, stale = _on_policy_and_stale(tmp_path)
    assert correction_spec("proximal").uses_proximal

    proximal, proximal_params = _step(tmp_path / "a", "proximal", on_policy)
    decoupled, decoupled_params = _step(tmp_path / "b", "decoupled", on_policy)
    assert proximal[M.POLICY_LOSS] == decoupled[M.POLICY_LOSS]
    assert all(torch.equal(a, b) for a, b in zip(proximal_params, decoupled_params, strict=True))
    assert math.isnan(proximal[M.OFFPOLICY_WEIGHT_MEAN])

    proximal, proximal_params = _step(tmp_path / "c", "proximal", stale)
    for other in ("naive", "decoupled"):
        metrics, params = _step(tmp_path / other, other, stale)
        assert metrics[M.POLICY_LOSS] != proximal[M.POLICY_LOSS], other
        assert any(not torch.equal(a, b) for a, b in zip(params, proximal_params, strict=True))
    # Its ratio starts at 1 (pi_old = pi_prox): the first minibatch is not clipped by the gap.
    naive, _ = _step(tmp_path / "e", "naive", stale)
    assert proximal[M.POLICY_RATIO_MAX] < naive[M.POLICY_RATIO_MAX]
    # The staleness it trains through unweighted shows in the ESS of the raw ratios (all equal
    # here: rho = exp(0.3) on every token, so ESS/N = 1).
    assert proximal[M.OFFPOLICY_ESS_FRAC] == pytest.approx(1.0, abs=1e-6)


def test_naive_gspo_sequence_ratio_starts_at_rho_geo() -> None:
    """With `naive`, pi_old = mu and the step starts at pi_theta = pi_prox, so GSPO's
    s_i = exp(mean_t log pi_prox / mu) = rho_geo, not its inverse (the module docstring).
    Row 0: log rho = (+0.2, -0.05, +0.15) -> mean 0.1 -> s_0 = e^0.1 = 1.105171;
    row 1: log rho = (-0.3, -0.1) -> mean -0.2 -> s_1 = e^-0.2 = 0.818731."""
    mu = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, 0.0]])
    log_rho = torch.tensor([[0.2, -0.05, 0.15], [-0.3, -0.1, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    pi_prox = mu + log_rho
    naive = correction_spec("naive")
    weights, _ = correction_weights(naive, pi_prox, mu, mask)
    assert weights is None and not naive.uses_proximal  # pi_old = mu, no weight
    _, stats = run(
        POLICY_LOSSES["gspo"],
        pi_prox,
        mu,
        torch.tensor([1.0, -1.0]),
        mask,
        make_arm(name="g", objective="gspo"),
    )
    rho_geo = [math.exp(0.1), math.exp(-0.2)]  # 1.105171, 0.818731
    assert stats[M.POLICY_RATIO_MIN] == pytest.approx(min(rho_geo), rel=1e-6)
    assert stats[M.POLICY_RATIO_MAX] == pytest.approx(max(rho_geo), rel=1e-6)
    assert stats[M.POLICY_RATIO_MEAN] == pytest.approx(sum(rho_geo) / 2, rel=1e-6)
