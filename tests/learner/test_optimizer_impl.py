"""`learner.optimizer_impl`: how AdamW steps. `auto` is fused kernels on a GPU (foreach, torch's
own default there, holds a float32 copy of the rank's parameters at the step) and torch's
default elsewhere, so a CPU learner steps exactly as before the option existed; every choice
trains the same weights up to float rounding (sharded ranks: tests/learner/test_fsdp.py)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from learner.config import LearnerConfig, make_arm
from learner.runtime.models import build_step_models
from tests.learner.lockstep import check_lockstep
from tests.learner.test_step_micro_batch import two_steps
from tests.learner.tiny import save_tiny_policy


def test_auto_is_fused_on_a_gpu_and_torchs_default_elsewhere() -> None:
    assert LearnerConfig().resolved_optimizer_impl == "for_loop"
    assert LearnerConfig(device="cuda").resolved_optimizer_impl == "fused"
    offloaded = LearnerConfig(device="cuda", parallel="fsdp", cpu_offload=True)
    assert offloaded.resolved_optimizer_impl == "for_loop"  # the step runs on the host
    for impl in ("fused", "foreach", "for_loop"):
        assert LearnerConfig(optimizer_impl=impl).resolved_optimizer_impl == impl
        assert LearnerConfig(device="cuda", optimizer_impl=impl).resolved_optimizer_impl == impl
    with pytest.raises(ValidationError, match="optimizer_impl"):
        LearnerConfig(optimizer_impl="apex")


@pytest.mark.parametrize("impl", ["fused", "foreach", "for_loop"])
def test_the_optimizers_step_as_chosen(tmp_path, impl: str) -> None:
    """The policy's and the critic's AdamW both take the choice."""
    model_dir = save_tiny_policy(tmp_path / "model")
    cfg = LearnerConfig(optimizer_impl=impl)
    models = build_step_models(model_dir, make_arm(name="a", objective="ppo"), cfg, 1)
    assert models.value is not None
    for optimized in (models.policy, models.value):
        defaults = optimized.optimizer.defaults
        assert (bool(defaults["fused"]), bool(defaults["foreach"])) == (
            impl == "fused",
            impl == "foreach",
        )


@pytest.mark.parametrize("impl", ["fused", "foreach"])
def test_every_implementation_trains_the_same_weights(tmp_path, impl: str) -> None:
    """Two PPO steps (policy and critic, 2 epochs of 2 minibatches: 8 AdamW updates moving the
    weights by ~4e-3) against the tensor-by-tensor step; `auto` on the CPU is that step, bit
    for bit. `impl` is compared update by update (tests/learner/lockstep.py): each update starts
    from the tensor-by-tensor step's weights and AdamW state, so the forward and backward are
    the same computation in the same order (the gradients and norms must be equal, n = 0), and
    the weights after the step differ by no more than each kernel's rounding of AdamW's
    arithmetic (`lockstep.adamw_bound`: ~10 roundings of the update, one of the weight)."""
    model_dir = save_tiny_policy(tmp_path / "model")
    ppo = {"objective": "ppo"}
    loop = two_steps(model_dir, ppo, optimizer_impl="for_loop")
    auto = two_steps(model_dir, ppo)
    assert auto.norms == loop.norms
    assert all(torch.equal(a, b) for a, b in zip(auto.params, loop.params, strict=True))
    other = two_steps(model_dir, ppo, follow=loop, optimizer_impl=impl)
    assert other.norms == loop.norms
    for name, a, b in zip(["policy", "critic"], loop.updates, other.updates, strict=True):
        check_lockstep(a, b, n=0, max_norm=LearnerConfig().grad_clip, what=name)
