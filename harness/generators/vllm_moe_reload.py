"""vLLM's in-place weight reload for MoE models on CPU, and when it may be trusted.

`collective_rpc("reload_weights")` is wrong for fused-MoE layers on CPU in vLLM 0.32: the CPU
experts (`CPUUnquantizedExperts.process_weights_after_loading`) prepack w13/w2 into a grouped-GEMM
layout only on the first load, so a reload leaves checkpoint-layout tensors where the kernel reads
packed ones (logprobs off by ~10 nats). `repack_cpu_moe` redoes exactly that prepack after a
reload; `weight_update_plan` says, per engine, whether a reload is right as it is (dense), right
with the repack (the verified CPU case), or must be a restart (anything not verified). Kept apart
from `vllm_backend`, which only calls these three.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

logger = logging.getLogger(__name__)

# How a new version reaches the engine: `reload` in place (dense models), `reload_repack` in place
# plus the CPU fused-MoE prepack vLLM skips on reloads, `restart` a fresh engine on the version.
WeightUpdate = Literal["reload", "reload_repack", "restart"]
# vLLM versions whose in-place MoE reload (with `repack_cpu_moe`) the tests have verified.
VERIFIED_MOE_RELOAD_VLLM = ("0.32.",)


def weight_update_plan(llm: Any, device: str) -> WeightUpdate:
    """`reload` for dense models; `reload_repack` for MoE where `repack_cpu_moe` is verified
    (CPU, vLLM 0.32, CPU grouped-GEMM experts); otherwise `restart`, since an in-place reload
    nobody has checked may serve stale or garbled weights (see the module docstring)."""
    import vllm

    layouts = llm.apply_model(moe_layouts)[0]
    if not layouts:
        return "reload"
    verified = vllm.__version__.startswith(VERIFIED_MOE_RELOAD_VLLM)
    if device == "cpu" and verified and all(kind == CPU_PREPACKED for kind in layouts):
        return "reload_repack"
    logger.warning(
        "vLLM %s on %s with MoE layers %s: in-place weight reload is not verified here, so each "
        "weight update restarts the engine",
        vllm.__version__,
        device,
        sorted(set(layouts)),
    )
    return "restart"


# `moe_layouts` tag of a fused-MoE layer whose experts run vLLM's CPU grouped GEMM on prepacked
# weights without intermediate padding: the one case `repack_cpu_moe` fixes.
CPU_PREPACKED = "cpu_prepacked"


def moe_layouts(model: Any) -> list[str]:
    """Worker side: one `_layout_tag` per fused-MoE layer of the model."""
    return [tag for module in model.modules() if (tag := _layout_tag(module)) is not None]


def _layout_tag(module: Any) -> str | None:
    """CPU_PREPACKED, another kernel's `method/experts` class names, or None (not fused MoE)."""
    from vllm.model_executor.layers.fused_moe import (
        FusedMoEMethodBase,
        UnquantizedFusedMoEMethod,
    )
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    method = getattr(module, "quant_method", None)
    if not isinstance(method, FusedMoEMethodBase):
        return None
    experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
    plain = isinstance(method, UnquantizedFusedMoEMethod) and isinstance(
        experts, CPUUnquantizedExperts
    )
    if plain and not getattr(experts, "_use_zentorch", True) and _unpadded(experts):
        return CPU_PREPACKED
    return f"{type(method).__name__}/{type(experts).__name__}"


def _unpadded(experts: Any) -> bool:
    """True when the CPU experts keep the checkpoint's intermediate size (no zero padding)."""
    config = experts.moe_config
    padded = experts._padded_intermediate_size(config)
    return padded == config.intermediate_size_per_partition


def repack_cpu_moe(model: Any) -> int:
    """Worker side: redo the CPU experts' prepack after a reload; returns the layers repacked.

    `reload_weights` copies checkpoint-layout w13/w2 into the prepacked parameters (vLLM 0.32
    skips `CPUUnquantizedExperts.process_weights_after_loading` on weight updates), so packing
    them once more, in place, gives exactly what a fresh engine computes at load.
    """
    import torch
    from vllm._custom_ops import cpu_prepack_moe_weight

    repacked = 0
    for module in model.modules():
        if _layout_tag(module) != CPU_PREPACKED:
            continue
        experts = module.quant_method.moe_kernel.fused_experts
        with torch.no_grad():
            for name in ("w13_weight", "w2_weight"):
                weight = getattr(module, name)
                weight.data.copy_(cpu_prepack_moe_weight(weight.data, experts.isa))
        repacked += 1
    return repacked
