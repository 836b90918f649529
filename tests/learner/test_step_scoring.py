"""How a learner step scores tokens: dropout off, eval-mode scoring passes, no NaN at the nucleus
edge (issue 13, parts 1 and 5)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import get_args

import pytest
import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    Qwen2ForCausalLM,
)

from buffer.collate import collate
from contract import metrics as M
from learner.algorithms.sampling_dist import LOGPROB_FLOOR, SamplingSettings
from learner.config import LearnerConfig, make_arm
from learner.runtime.dropout import disable_dropout
from learner.runtime.forward import policy_logprobs, scoring
from learner.runtime.models import build_step_models
from learner.runtime.step import train_on_batch
from learner.vocabulary import Objective
from tests.learner.rollout_steps import train_step
from tests.learner.tiny import random_groups, save_tiny_policy
from tests.tiny_models import RAW_IDS, TinyArch, tiny_config

GROUP_SIZE = 4
OBJECTIVES: tuple[str, ...] = get_args(Objective)


def save_with_dropout(directory: Path, arch: str) -> Path:
    """A tiny policy whose dropout is 0.5 everywhere it can be set."""
    torch.manual_seed(0)
    dims = TinyArch(tie_embeddings=False)  # both architectures: the tests' dense policy sizes
    if arch == "qwen2":  # attention dropout: a float the attention module reads in train mode
        qwen2 = tiny_config(dims, RAW_IDS)
        qwen2.attention_dropout = 0.5
        model: nn.Module = Qwen2ForCausalLM(qwen2)
    else:  # GPT-2: nn.Dropout modules on embeddings, attention and residuals
        config = GPT2Config(
            vocab_size=RAW_IDS.vocab_size,
            n_embd=dims.hidden,
            n_layer=dims.layers,
            n_head=dims.heads,
            n_positions=dims.max_positions,
            resid_pdrop=0.5,
            embd_pdrop=0.5,
            attn_pdrop=0.5,
            bos_token_id=RAW_IDS.bos,
            eos_token_id=RAW_IDS.eos,
        )
        model = GPT2LMHeadModel(config)
    model.save_pretrained(directory)
    return directory


def dropout_levels(module: nn.Module) -> list[float]:
    """Every nonzero dropout probability left in `module` (nn.Dropout or a float attribute)."""
    levels = [m.p for m in module.modules() if isinstance(m, nn.Dropout) and m.p]
    for sub in module.modules():
        levels += [
            value
            for name, value in vars(sub).items()
            if "dropout" in name and isinstance(value, float) and value
        ]
    return levels


def on_policy_groups(model_dir: Path, sampling: SamplingSettings = SamplingSettings()):
    """Groups whose behaviour log-probs are the loaded weights' own, scored in eval mode (as a
    generator does)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def logprobs(prompt, response):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            lp, _ = policy_logprobs(model, ids, torch.ones_like(ids), sampling)
        return lp[0, len(prompt) :].tolist()

    return random_groups(2, GROUP_SIZE, seed=1, with_logprobs=logprobs)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_dropout_is_off_in_policy_critic_and_reference(tmp_path: Path, arch: str) -> None:
    model_dir = save_with_dropout(tmp_path / arch, arch)
    raw = AutoModelForCausalLM.from_pretrained(model_dir)
    assert dropout_levels(raw)  # the saved model does have dropout
    assert not dropout_levels(disable_dropout(raw))
    arm = make_arm(name="ppo", objective="ppo", beta=0.1)  # critic and reference too
    models = build_step_models(model_dir, arm, LearnerConfig(prompts_per_step=2), total_steps=1)
    assert models.value is not None and models.reference is not None
    for module in (models.policy.module, models.value.module, models.reference):
        assert not dropout_levels(module)
    config = models.policy.module.config
    assert all(
        getattr(config, name, 0.0) == 0.0
        for name in ("attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop")
    )


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
@pytest.mark.parametrize("objective", ["grpo", "ppo"])
def test_a_model_with_dropout_gives_ratio_one(tmp_path: Path, arch: str, objective: str) -> None:
    model_dir = save_with_dropout(tmp_path / arch, arch)
    arm = make_arm(name=objective, objective=objective)
    cfg = LearnerConfig(prompts_per_step=2, minibatches=1, old_logprobs="behavior")
    models = build_step_models(model_dir, arm, cfg, total_steps=1)
    batch = collate(on_policy_groups(model_dir), pad_id=0)
    m = train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=0
    ).metrics
    assert abs(m[M.POLICY_RATIO_MIN] - 1.0) <= 1e-5 and abs(m[M.POLICY_RATIO_MAX] - 1.0) <= 1e-5
    assert m[M.MISMATCH_KL_BEHAVIOR] < 1e-9


def test_only_gradient_passes_run_in_train_mode(tmp_path: Path) -> None:
    """pi_old, the reference, the critic's old values and diagnostics: eval + no_grad; the
    minibatch passes of policy and critic: train mode with gradients."""
    model_dir = save_tiny_policy(tmp_path / "model")
    arm = make_arm(name="ppo", objective="ppo", beta=0.1)
    cfg = LearnerConfig(prompts_per_step=2, minibatches=2, old_logprobs="recompute")
    models = build_step_models(model_dir, arm, cfg, total_steps=1)
    assert models.value is not None and models.reference is not None
    seen: dict[str, list[tuple[bool, bool]]] = {"policy": [], "value": [], "reference": []}
    for name, module in [
        ("policy", models.policy.module),
        ("value", models.value.module),
        ("reference", models.reference),
    ]:
        module.register_forward_hook(
            lambda m, *_, name=name: seen[name].append((m.training, torch.is_grad_enabled()))
        )
    batch = collate(random_groups(2, GROUP_SIZE), pad_id=0)
    train_on_batch(models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=0)
    # One scoring pass (pi_old) then one gradient pass per minibatch, for policy and critic.
    assert seen["policy"] == [(False, False), (True, True), (True, True)]
    assert seen["value"] == [(False, False), (True, True), (True, True)]
    assert seen["reference"] == [(False, False)]
    assert models.policy.module.training and models.value.module.training


@pytest.mark.parametrize("old_logprobs", ["behavior", "recompute"])
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_tokens_outside_the_learner_nucleus_give_no_nan(
    tmp_path: Path, objective: str, old_logprobs: str
) -> None:
    """Random tokens scored by a near-uniform policy at top-p 0.3: many fall outside its nucleus
    (log-prob -inf, floored). The step stays finite and the weights too, with a KL-to-reference
    term on; in recompute mode such a token's pi_old is floored as well."""
    model_dir = save_tiny_policy(tmp_path / "model")
    sampling = SamplingSettings(temperature=0.7, top_p=0.3)
    arm = make_arm(name=objective, objective=objective, beta=0.1)
    cfg = LearnerConfig(prompts_per_step=2, minibatches=2, lr=1e-2, old_logprobs=old_logprobs)
    models = build_step_models(model_dir, arm, cfg, total_steps=1)
    batch = collate(random_groups(2, GROUP_SIZE, seed=3), pad_id=0)
    with scoring(models.policy.module):
        lp, _ = policy_logprobs(
            models.policy.module, batch.input_ids, batch.attention_mask, sampling
        )
    floored = (lp == LOGPROB_FLOOR) & batch.response_mask.bool()
    assert 0 < int(floored.sum()) < int(batch.response_mask.sum())  # both kinds of token present
    result = train_step(
        models, batch, arm, cfg, group_size=GROUP_SIZE, max_len=8, sampling=sampling
    )
    # NaN by definition here: no stale row (all version 0), and naive applies no weight.
    not_measured = {M.STALENESS_KL_BEHAVIOR} | (
        {M.OFFPOLICY_WEIGHT_MEAN} if old_logprobs == "behavior" else set()
    )
    measured = {k: v for k, v in result.metrics.items() if k not in not_measured}
    assert all(math.isfinite(v) for v in measured.values()), result.metrics
    assert all(math.isnan(result.metrics[k]) for k in not_measured)
    assert all(math.isfinite(g) for g in result.grad_norms)
    assert all(torch.isfinite(p).all() for p in models.policy.module.parameters())
