"""MoE routing: capture, replay (against the unpatched router), metrics, and learner steps.

The tiny Qwen3-MoE here (4 experts, top-2, 2 layers) is random-initialised with a wide init so the
router has clear preferences; a large learning rate then moves some tokens to other experts.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from transformers import PreTrainedModel
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from buffer.collate import RolloutBatch, collate
from contract import metrics as M
from learner.config import LearnerConfig, make_arm
from learner.runtime.forward import policy_logprobs, scoring
from learner.runtime.models import build_step_models
from learner.runtime.moe.base import NO_ROUTING
from learner.runtime.moe.hooks import (
    RoutingRecord,
    capture_routing,
    is_moe,
    replay_routing,
    replayed_scores,
)
from learner.runtime.moe.logratio import LOGRATIO_METRICS
from learner.runtime.moe.metrics import (
    load_imbalance_per_layer,
    predicting_positions,
    rerouted_counts,
    router_entropy_per_layer,
    routing_change_per_layer,
)
from learner.runtime.moe.routing import MoeRouting, StepRouting
from learner.runtime.moe.setup import setup_routing
from learner.runtime.moe.tally import MOE_METRICS, routing_metrics
from learner.runtime.step import train_on_batch
from learner.runtime.update import MicroBatch, micro_batches
from tests.learner.test_step import GROUP_SIZE
from tests.learner.tiny import VOCAB, random_groups, tiny_policy
from tests.tiny_models import MOE_POLICY, tiny_config, tiny_model

EXPERTS, TOP_K, LAYERS = MOE_POLICY.experts, MOE_POLICY.experts_per_token, MOE_POLICY.layers


class Rows(NamedTuple):
    """A step batch as routing reads it (`learner.runtime.moe.base.RoutedBatch`)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    routed_experts: torch.Tensor | None = None


def tiny_moe(seed: int = 0) -> PreTrainedModel:
    return tiny_model(MOE_POLICY, seed=seed).eval()


def moe_batch(model: torch.nn.Module, n_groups: int = 4) -> RolloutBatch:
    """Ragged groups whose behaviour logprobs are the model's own (an on-policy start)."""

    def logprobs(prompt: list[int], response: list[int]) -> list[float]:
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            lp, _ = policy_logprobs(model, ids, torch.ones_like(ids))
        return lp[0, len(prompt) :].tolist()

    return collate(random_groups(n_groups, GROUP_SIZE, seed=1, with_logprobs=logprobs), pad_id=0)


def moe_batch_routed_by_another() -> RolloutBatch:
    """The tiny MoE's on-policy batch carrying as `routed_experts` another model's routing of it
    (same shape, valid experts, different choices: so a replay of the wrong rows or positions
    would show in the log-probs), as a generator's routing under R3."""
    batch = moe_batch(tiny_moe())
    with torch.no_grad(), capture_routing(other := tiny_moe(seed=1)) as recorder:
        other(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    return dataclasses.replace(batch, routed_experts=recorder.indices(*batch.input_ids.shape))


def whole_batch(batch: RolloutBatch) -> list[MicroBatch]:
    """The step batch as one part at its own width (no `learner.micro_batch_tokens`)."""
    rows = torch.arange(batch.batch_size)[None, :]  # (1, B)
    return micro_batches(rows, 0, batch.attention_mask.sum(-1), None)


def forward_logits(model: torch.nn.Module, batch: RolloutBatch) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits


def capture(model: torch.nn.Module, batch: RolloutBatch) -> tuple[RoutingRecord, torch.Tensor]:
    with capture_routing(model) as recorder:
        logits = forward_logits(model, batch)
    return recorder.routing(*batch.input_ids.shape), logits


# ---- replay against the unpatched router -------------------------------------------------------


def test_replayed_scores_hand_worked() -> None:
    # probs (0.5, 0.3, 0.2); experts {0, 2}: raw gates (0.5, 0.2), renormalised (5/7, 2/7).
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    indices = torch.tensor([[0, 2]])
    raw = replayed_scores(logits, indices, norm_topk_prob=False)
    torch.testing.assert_close(raw, torch.tensor([[0.5, 0.2]]), rtol=1e-6, atol=0)
    normed = replayed_scores(logits, indices, norm_topk_prob=True)
    torch.testing.assert_close(normed, torch.tensor([[5 / 7, 2 / 7]]), rtol=1e-6, atol=0)


def test_sparse_block_replaying_its_own_choice_is_bitwise_unchanged() -> None:
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(tiny_config(MOE_POLICY)).float()
    torch.nn.init.normal_(block.gate.weight, std=0.5)
    torch.nn.init.normal_(block.experts.gate_up_proj, std=0.2)
    torch.nn.init.normal_(block.experts.down_proj, std=0.2)
    hidden = torch.randn(3, 5, 32)  # (B, L, H)
    plain = block(hidden)
    with capture_routing(block) as recorder:
        block(hidden)
    routing = recorder.routing(3, 5)
    assert routing.indices.shape == (1, 3, 5, TOP_K) and routing.entropy.shape == (1, 3, 5)
    assert routing.num_experts == EXPERTS
    with replay_routing(block, routing):
        replayed = block(hidden)
    assert torch.equal(replayed, plain)
    assert not block._forward_hooks and not block.gate._forward_hooks  # hooks removed on exit


def test_replay_really_routes_through_the_given_experts() -> None:
    model = tiny_moe()
    batch = moe_batch(model)
    routing, logits = capture(model, batch)
    # Every token of every layer forced onto experts {0, 1} (rarely the router's own choice).
    forced = torch.zeros_like(routing.indices)
    forced[..., 1] = 1
    with (
        replay_routing(model, RoutingRecord(forced, routing.entropy, EXPERTS)),
        capture_routing(model) as seen,
    ):
        replayed_logits = forward_logits(model, batch)
    assert torch.equal(seen.routing(*batch.input_ids.shape).indices, forced)
    assert not torch.equal(replayed_logits, logits)
    two_rows = routing.rows(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"RoutingRecord\.rows"), replay_routing(model, two_rows):
        forward_logits(model, batch)


# ---- metrics: hand-worked ----------------------------------------------------------------------


def test_load_imbalance_hand_worked() -> None:
    # One layer, 4 tokens, top-1 of 2 experts: loads (3, 1), mean 2 -> max/mean = 1.5.
    indices = torch.tensor([0, 0, 0, 1]).reshape(1, 1, 4, 1)
    mask = torch.ones(1, 4)
    assert load_imbalance_per_layer(indices, mask, 2).tolist() == [1.5]
    # Masking the last token: loads (3, 0), mean 1.5 -> 2.0 (all on one expert).
    mask[0, 3] = 0
    assert load_imbalance_per_layer(indices, mask, 2).tolist() == [2.0]


def test_router_entropy_hand_worked() -> None:
    # Uniform over 4 experts: ln 4; one-hot-ish (logit 100 vs 0): ~0. Masked tokens ignored.
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])[None]  # (1,1,2,4)
    entropy = router_entropy_per_layer(logits, torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(entropy, torch.tensor([math.log(4)]), rtol=1e-6, atol=0)


def test_routing_change_counts_sets_not_order() -> None:
    # token 0: {0,1} vs {1,0} same set; token 1: {2,3} vs {2,1} differs; token 2 masked out.
    old = torch.tensor([[0, 1], [2, 3], [0, 1]]).reshape(1, 1, 3, 2)
    new = torch.tensor([[1, 0], [2, 1], [3, 2]]).reshape(1, 1, 3, 2)
    change = routing_change_per_layer(old, new, torch.tensor([[1.0, 1.0, 0.0]]))
    assert change.tolist() == [0.5]


def test_tokens_rerouted_in_any_layer_hand_worked() -> None:
    """3 layers x 4 tokens (top-2), token 3 masked out. Layer 0 changes token 0, layer 1 tokens
    0 and 1, layer 2 token 3 only (masked): per layer 1/3, 2/3, 0 of the scored tokens; in at
    least one layer tokens 0 and 1, 2/3, not the 1/3 + 2/3 + 0 a sum over layers would say."""
    same = [[0, 1], [2, 3], [4, 5], [6, 7]]
    old = torch.tensor([same, same, same]).reshape(3, 1, 4, 2)
    new = torch.tensor(
        [
            [[0, 2], [2, 3], [4, 5], [6, 7]],
            [[1, 3], [3, 2], [5, 4], [6, 7]],  # token 1 and 2: same sets in another order
            [[0, 1], [2, 3], [4, 5], [0, 1]],
        ]
    ).reshape(3, 1, 4, 2)
    new[1, 0, 1] = torch.tensor([2, 7])  # token 1 at layer 1: a new expert
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    per_layer, anywhere = rerouted_counts(old, new, mask)
    assert per_layer.tolist() == [1, 2, 0] and int(anywhere) == 2
    metrics = routing_metrics(
        RoutingRecord(old, torch.zeros(3, 1, 4), num_experts=8),
        RoutingRecord(new, torch.zeros(3, 1, 4), 8),
        mask,
    )
    assert metrics[M.MOE_ROUTING_CHANGE_FRAC] == pytest.approx(1 / 3)  # mean of 1/3, 2/3, 0
    assert metrics[M.MOE_ROUTING_CHANGE_MAX] == pytest.approx(2 / 3)
    assert metrics[M.MOE_TOKEN_REROUTED_FRAC] == pytest.approx(2 / 3)
    # Each layer's own share, the values the mean and max above are taken of.
    per_layer = [metrics[M.moe_routing_change_layer(i)] for i in range(3)]
    assert per_layer == pytest.approx([1 / 3, 2 / 3, 0.0])
    assert M.moe_routing_change_layer(1) == "moe/routing_change_frac/layer_01"
    # Against the generator's experts: the same counts under their own names.
    rollout = routing_metrics(
        RoutingRecord(old, torch.zeros(3, 1, 4), 8),
        RoutingRecord(old, torch.zeros(3, 1, 4), 8),
        mask,
        rollout=new,
    )
    assert rollout[M.MOE_ROLLOUT_ROUTING_MISMATCH] == pytest.approx(1 / 3)
    assert rollout[M.MOE_ROLLOUT_TOKEN_REROUTED_FRAC] == pytest.approx(2 / 3)
    assert rollout[M.MOE_TOKEN_REROUTED_FRAC] == 0.0  # old vs itself


def test_predicting_positions_shift_left_by_one() -> None:
    # Response tokens at 2, 3 are scored by the outputs at positions 1, 2.
    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0]])
    assert predicting_positions(mask).tolist() == [[0.0, 1.0, 1.0, 0.0, 0.0]]


def test_routing_metrics_of_identical_captures() -> None:
    model = tiny_moe()
    batch = moe_batch(model)
    routing, _ = capture(model, batch)
    metrics = routing_metrics(routing, routing, batch.response_mask)
    assert set(metrics) == set(MOE_METRICS) | {M.moe_routing_change_layer(i) for i in range(LAYERS)}
    for name in (M.MOE_ROUTING_CHANGE_FRAC, M.MOE_ROUTING_CHANGE_MAX, M.MOE_TOKEN_REROUTED_FRAC):
        assert metrics[name] == 0.0
    assert 1.0 <= metrics[M.MOE_LOAD_IMBALANCE] <= EXPERTS / TOP_K
    assert 0.0 < metrics[M.MOE_ROUTER_ENTROPY] <= math.log(EXPERTS)


# ---- learner steps on the MoE policy -----------------------------------------------------------


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("moe")
    tiny_moe().save_pretrained(directory)
    return directory


ARMS = {
    "gspo": make_arm(name="gspo", objective="gspo"),
    "grpo": make_arm(name="grpo", objective="grpo"),
    "grpo_replay": make_arm(name="grpo_replay", objective="grpo", routing_replay="old"),
    "ppo": make_arm(name="ppo", objective="ppo"),
}


@pytest.mark.parametrize("arm_name", list(ARMS))
def test_each_arm_trains_the_moe_policy(moe_dir: Path, arm_name: str) -> None:
    arm = ARMS[arm_name]
    cfg = LearnerConfig(prompts_per_step=4, minibatches=2, lr=1e-2, old_logprobs="recompute")
    models = build_step_models(moe_dir, arm, cfg, total_steps=3)
    before = [p.detach().clone() for p in models.policy.module.parameters()]
    batch = moe_batch(tiny_moe())
    for step in range(3):
        result = train_on_batch(
            models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=step
        )
        m = result.metrics
        # Rows stay version 0: the engine gap is measured at step 0 only, the staleness gap after.
        unmeasured = M.STALENESS_KL_BEHAVIOR if step == 0 else M.MISMATCH_KL_BEHAVIOR
        assert math.isnan(m[unmeasured])
        checked = {k: v for k, v in m.items() if k != unmeasured}
        assert all(math.isfinite(v) for v in checked.values()), m
        moe_keys = {k for k in m if k.startswith("moe/")}  # only the registered names
        layers = {M.moe_routing_change_layer(i) for i in range(LAYERS)}
        assert moe_keys == set(MOE_METRICS) | set(LOGRATIO_METRICS) | layers
        assert 0.0 <= m[M.MOE_ROUTING_LOGRATIO_VAR_FRAC] <= 1.0
    after = list(models.policy.module.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_routing_change_is_zero_without_an_update_and_positive_after_one(moe_dir: Path) -> None:
    arm = ARMS["grpo"]
    cfg = LearnerConfig(prompts_per_step=4, lr=0.5, old_logprobs="recompute")
    models = build_step_models(moe_dir, arm, cfg, total_steps=2)
    batch = moe_batch(tiny_moe())
    # Equal rewards: every advantage is 0, so the gradient and AdamW's step are exactly 0.
    flat = dataclasses.replace(batch, rewards=torch.ones_like(batch.rewards))
    still = train_on_batch(
        models, flat, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=0
    )
    assert still.metrics[M.MOE_ROUTING_CHANGE_FRAC] == 0.0
    moved = train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=1
    )
    assert moved.metrics[M.MOE_ROUTING_CHANGE_FRAC] > 0.0


def test_replay_reproduces_pi_old_and_departs_from_plain_forward_after_update() -> None:
    model = tiny_moe()
    batch = moe_batch(model)
    ids, attn = batch.input_ids, batch.attention_mask
    routing = StepRouting(model, "old", ids, attn)
    parts = whole_batch(batch)
    with torch.no_grad(), routing.capture_old(parts) as around, around(parts[0]):
        old_lp, _ = policy_logprobs(model, ids, attn)
    all_rows = torch.arange(ids.shape[0])
    with torch.no_grad(), routing.replay(all_rows):
        replayed_lp, _ = policy_logprobs(model, ids, attn)
    assert torch.equal(replayed_lp, old_lp)  # unchanged weights: exactly pi_old
    rows = torch.arange(GROUP_SIZE, 2 * GROUP_SIZE)  # one minibatch (group 1)
    with torch.no_grad(), routing.replay(rows):
        minibatch_lp, _ = policy_logprobs(model, ids[rows], attn[rows])
    torch.testing.assert_close(minibatch_lp, old_lp[rows], rtol=0, atol=1e-6)
    # A large step on every router: some tokens now prefer other experts.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.add_(torch.randn_like(layer.mlp.gate.weight))
    assert routing.metrics(batch.response_mask)[M.MOE_ROUTING_CHANGE_FRAC] > 0
    with torch.no_grad(), routing.replay(all_rows):
        replayed_lp, _ = policy_logprobs(model, ids, attn)
    with torch.no_grad():
        plain_lp, _ = policy_logprobs(model, ids, attn)
    mask = batch.response_mask.bool()
    assert not torch.equal(replayed_lp[mask], plain_lp[mask])


def test_dense_policy_has_no_moe_metrics_and_refuses_replay() -> None:
    dense = tiny_policy()
    assert not is_moe(dense) and is_moe(tiny_moe())
    ids = torch.randint(3, VOCAB, (2, 5))
    attn = torch.ones_like(ids)
    routing = setup_routing(dense, "off")
    assert routing is NO_ROUTING
    parts = micro_batches(torch.arange(2)[None, :], 0, attn.sum(-1), None)
    with routing.capture_old(Rows(ids, attn), parts) as around, around(parts[0]):
        dense(input_ids=ids, attention_mask=attn)
    with routing.replay(torch.arange(2)):
        dense(input_ids=ids, attention_mask=attn)
    assert routing.metrics(ids.float()) == {}
    with pytest.raises(ValueError, match="routing_replay: old needs an MoE policy"):
        setup_routing(dense, "old")


def test_routing_is_chosen_once_and_a_dense_step_runs_no_moe_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`build_step_models` picks the routing; a dense step then never asks the hooks whether
    its policy is an MoE, nor builds any MoE step state."""
    arm, cfg = ARMS["grpo"], LearnerConfig(prompts_per_step=2, old_logprobs="recompute")
    tiny_moe().save_pretrained(tmp_path / "moe")
    assert isinstance(build_step_models(tmp_path / "moe", arm, cfg, 1).routing, MoeRouting)
    tiny_policy().save_pretrained(tmp_path / "dense")
    models = build_step_models(tmp_path / "dense", arm, cfg, total_steps=1)
    assert models.routing is NO_ROUTING

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("a dense step reached the MoE code")

    monkeypatch.setattr("learner.runtime.moe.hooks.router_modules", refused)
    monkeypatch.setattr("learner.runtime.moe.routing.router_modules", refused)
    monkeypatch.setattr(StepRouting, "__init__", refused)
    batch = collate(random_groups(2, GROUP_SIZE, seed=2), pad_id=0)
    result = train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=0
    )
    assert not any(name.startswith("moe/") for name in result.metrics)


def test_moe_routing_holds_a_step_from_capture_to_metrics() -> None:
    """One `MoeRouting` serves every step: `capture_old` starts one, `metrics` ends it (and lets
    its host record go), and replay outside a step is an error, not a silent no-op."""
    model = tiny_moe()
    batch = moe_batch(model)
    ids, attn = batch.input_ids, batch.attention_mask
    routing = setup_routing(model, "old")
    assert isinstance(routing, MoeRouting)
    with pytest.raises(RuntimeError, match="outside a step: call capture_old first"):
        routing.replay(torch.arange(2))
    parts = whole_batch(batch)
    for _step in range(2):
        old_pass = routing.capture_old(Rows(ids, attn), parts)
        with scoring(model), old_pass as around, around(parts[0]):
            model(input_ids=ids, attention_mask=attn)
        assert routing.step is not None and routing.step.old is not None
        with scoring(model):
            assert routing.metrics(batch.response_mask)[M.MOE_ROUTING_CHANGE_FRAC] == 0.0
        assert routing.step is None
