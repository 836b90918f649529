"""Build the modules a learner step needs: policy, PPO critic, frozen reference, optimisers."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForCausalLM

from learner.config import ArmBase, LearnerConfig
from learner.runtime.distributed import DistContext
from learner.runtime.dropout import disable_dropout
from learner.runtime.moe.setup import setup_routing
from learner.runtime.schedule import lr_multiplier
from learner.runtime.sharding import enable_activation_checkpointing, is_sharded, shard
from learner.runtime.step import Optimised, StepModels
from learner.runtime.value_model import ValueModel


def load_causal_lm(model_dir: Path, device: str = "cpu") -> nn.Module:
    """The policy in float32: the learner's math (ratios near 1 +- 3e-4) needs the precision.

    Dropout is off (`learner.runtime.dropout`); the critic and reference are copies, so theirs is
    too.
    """
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return disable_dropout(model).to(device)


def _optimised(module: nn.Module, lr: float, cfg: LearnerConfig, total_updates: int) -> Optimised:
    impl = cfg.resolved_optimizer_impl  # `fused` on a GPU: no parameter-sized temporary
    optimizer = torch.optim.AdamW(
        module.parameters(),
        lr=lr,
        betas=cfg.betas,
        weight_decay=cfg.weight_decay,
        fused=impl == "fused",
        foreach=impl == "foreach",
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda update: lr_multiplier(update, cfg.warmup_steps, total_updates, cfg.schedule),
    )
    return Optimised(module, optimizer, scheduler)


def build_step_models(
    model_dir: Path, arm: ArmBase, cfg: LearnerConfig, total_steps: int
) -> StepModels:
    """Every arm starts from the same weights file; PPO adds a critic, beta > 0 a reference,
    and the policy's routing is chosen here, once (`setup_routing`: MoE or the dense no-op).

    `learner.activation_checkpointing` recomputes each block's activations in backward (policy
    and critic); `learner.parallel=fsdp` shards policy, critic and reference with FSDP2
    (`learner.runtime.sharding`) before the optimisers are made, so AdamW holds (and steps) only
    this rank's shards. FSDP needs a process group: join it first (`init_distributed`).
    """
    # Sharded: built on the CPU, and FSDP moves one unit at a time to the device as it shards
    # it (`learner.runtime.sharding.shard`): no device ever holds the whole model.
    policy = load_causal_lm(model_dir, "cpu" if cfg.parallel == "fsdp" else cfg.device)
    policy.train()
    total_updates = total_steps * cfg.ppo_epochs * cfg.minibatches
    critic = ValueModel(policy) if arm.needs_value_model else None
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if arm.beta > 0 else None
    if cfg.activation_checkpointing:
        for module in (policy, critic):
            if module is not None:
                enable_activation_checkpointing(module)
    if cfg.parallel == "fsdp":
        for module in (policy, critic, reference):
            if module is not None:
                shard(module, cfg)
    value = _optimised(critic, cfg.value_lr, cfg, total_updates) if critic is not None else None
    routing = setup_routing(policy, arm.routing_replay)  # hooks the policy itself, never a wrapper
    policy_opt = _optimised(policy, cfg.lr, cfg, total_updates)
    return StepModels(policy_opt, value, reference, routing=routing)


def checkpoint_modules(models: StepModels) -> dict[str, object]:
    """Name -> object with state_dict/load_state_dict, for the checkpoint store."""
    modules: dict[str, object] = {
        "policy": models.policy.module,
        "policy_optimizer": models.policy.optimizer,
        "policy_scheduler": models.policy.scheduler,
    }
    if models.value is not None:
        modules |= {
            "value": models.value.module,
            "value_optimizer": models.value.optimizer,
            "value_scheduler": models.value.scheduler,
        }
    return modules


def wrap_ddp(models: StepModels, dist: DistContext) -> StepModels:
    """The same models with policy and critic in DistributedDataParallel (gradients averaged over
    ranks in backward); `models` itself when single-process. Optimisers keep the same parameters,
    and state dicts, eval and the weight store keep using the unwrapped `models`."""
    if dist.world_size == 1 or is_sharded(models.policy.module):  # FSDP syncs on its own
        return models

    def ddp(opt: Optimised) -> Optimised:
        on_cuda = next(opt.module.parameters()).is_cuda
        device_ids = [dist.local_rank] if on_cuda else None
        wrapped = DistributedDataParallel(opt.module, device_ids=device_ids)
        return Optimised(wrapped, opt.optimizer, opt.scheduler)

    value = ddp(models.value) if models.value is not None else None
    return StepModels(ddp(models.policy), value, models.reference, routing=models.routing)
