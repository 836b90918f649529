"""FSDP2 for the learner (`learner.parallel: fsdp`): shard the models, gather full weights.

Why FSDP2 (`torch.distributed.fsdp.fully_shard`) and not DDP for large models: DDP keeps the
whole model, its gradients and AdamW's two moments on every rank (16 bytes a parameter in
float32), FSDP splits all of them over the ranks and gathers one decoder block's parameters at a
time for its forward and backward. Each decoder block is its own FSDP unit, the root (final
norm, output head) another, so at most about two blocks' full parameters exist at once beside
the root's, which FSDP2 keeps gathered from forward to backward. An untied model's input
embedding is a unit of its own (`embedding_unit`): gathered for its forward and its backward
only, not held with the root. The output head stays in the root: chunked log-probs
(`learner.runtime.forward`) call it once a chunk, a number that differs between ranks, and a
unit of its own would gather in every call (a collective the other ranks would not join).

What stays the same as under DDP: every rank holds the whole batch, trains its share of each
minibatch, and the gradient is averaged over ranks (FSDP2's reduce-scatter divides by the number
of ranks, as DDP's all-reduce does), so `learner.runtime.update.accumulate` scales each loss by
the world size under both. Passes without a gradient (pi_old, reference, old values) run on every
rank through the sharded modules, each rank the same forwards, so the gathers line up.

Precision (`learner.dtype: bfloat16`): FSDP2's MixedPrecisionPolicy casts the gathered
parameters to bf16 for compute and reduces gradients in float32; the sharded parameters the
optimizer steps stay float32 (master weights). Log-probabilities are taken from float32 logits
(`learner.runtime.forward` casts before the log-softmax).

Full weights for the generators (`gather_full_weights`): one parameter at a time is gathered
(every rank takes part) and rank 0 keeps it on the CPU in the published dtype, so no rank ever
holds a float32 copy of the whole model beside its shard.
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from learner.config import LearnerConfig
from learner.runtime.distributed import DistContext

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def decoder_blocks(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a causal LM or of the critic's backbone (HF layout:
    `model.layers` or `layers`), in order. A model without that layout is refused: sharding only
    the root would gather the whole model for every forward."""
    for holder in (getattr(module, "model", None), getattr(module, "backbone", None), module):
        layers = getattr(holder, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return list(layers)
    raise ValueError(
        f"{type(module).__name__} has no decoder blocks at .model.layers or .layers; "
        "learner.parallel=fsdp shards one block at a time and needs them"
    )


def embedding_unit(module: nn.Module) -> nn.Module | None:
    """The input embedding of a causal LM or of the critic's backbone, to shard as its own unit;
    None when it is tied to the output head (one parameter stays in one unit: the root) or the
    model has none. Every forward calls it exactly once on every rank, so its gathers line up."""
    target = getattr(module, "backbone", module)
    get_input = getattr(target, "get_input_embeddings", None)
    embedding = get_input() if get_input is not None else None
    if not isinstance(embedding, nn.Module):
        return None
    get_output = getattr(module, "get_output_embeddings", None)
    head = get_output() if get_output is not None else None
    if head is not None and getattr(head, "weight", None) is embedding.weight:
        return None  # tied
    return embedding


def shard(module: nn.Module, cfg: LearnerConfig) -> nn.Module:
    """`fully_shard` each decoder block, an untied input embedding (`embedding_unit`), then the
    root, with the learner's precision (and CPU offload); returns the same module, now an
    FSDPModule.

    Give it the module on the CPU: FSDP moves each unit to the learner's device as it shards
    it, so the device never holds more than the shards done so far and one whole unit (the
    rest of the model waits in host memory)."""
    mixed = MixedPrecisionPolicy(
        param_dtype=DTYPES[cfg.dtype], reduce_dtype=torch.float32, output_dtype=None
    )
    # The learner's device, not FSDP's default (CUDA whenever a GPU is visible).
    mesh = init_device_mesh(cfg.device, (torch_dist.get_world_size(),))
    options: dict[str, object] = {"mp_policy": mixed, "mesh": mesh}
    if cfg.cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    for block in decoder_blocks(module):
        fully_shard(block, **options)
    if (embedding := embedding_unit(module)) is not None:
        fully_shard(embedding, **options)
    fully_shard(module, **options)
    return module


def enable_activation_checkpointing(module: nn.Module) -> None:
    """Recompute each decoder block's activations in backward (non-reentrant checkpointing,
    which keeps working with FSDP's hooks and with DDP): HF models through their own switch,
    the critic's backbone (an HF base model) likewise."""
    target = getattr(module, "backbone", module)
    enable = getattr(target, "gradient_checkpointing_enable", None)
    if enable is None:
        raise ValueError(
            f"{type(target).__name__} cannot checkpoint activations "
            "(no gradient_checkpointing_enable); unset learner.activation_checkpointing"
        )
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    config = getattr(target, "config", None)
    if config is not None:
        config.use_cache = False  # HF warns and turns the cache off under checkpointing anyway


def is_sharded(module: nn.Module) -> bool:
    """Whether `module`'s parameters are DTensor shards (it went through `shard`)."""
    return any(isinstance(p, DTensor) for p in module.parameters())


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective: every rank must call it); a plain tensor as is."""
    return value.full_tensor() if isinstance(value, DTensor) else value


def gather_full_weights(
    module: nn.Module, dist: DistContext, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The model's full state dict on rank 0's CPU (empty on the other ranks), one tensor at a
    time, each cast to `dtype` when given (the published precision).

    Every rank must call this together: each sharded tensor's gather is a collective. The
    peak on rank 0 is the kept copy (in `dtype`) plus one float32 tensor in flight.
    """
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}  # tied weights (embedding = output head) stay one tensor
    for name, value in module.state_dict().items():
        if id(value) in seen:
            if dist.is_main:
                out[name] = seen[id(value)]
            continue
        whole = full_tensor(value.detach())
        if dist.is_main:
            cast = dtype if dtype is not None and whole.is_floating_point() else None
            kept = whole.to("cpu", dtype=cast, copy=True)
            out[name] = seen[id(value)] = kept
    return out
