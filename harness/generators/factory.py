"""`make_generator`: the one place a `GenerationConfig` becomes a running generator."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from harness.config import GenerationConfig, GeneratorBackend
from harness.generators.base import Generator
from harness.generators.kept_engines import kept_or_new
from harness.models.tokenizer import load_tokenizer

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _torch(gen_cfg: GenerationConfig, model_dir: Path, seed: int) -> Generator:
    # Each backend is imported only when chosen: vLLM's import takes seconds and needs its
    # extra installed, and neither backend imports this module (no cycle is hidden here).
    from harness.generators.torch_backend import TorchGenerator

    del seed  # every sample carries its own seed; nothing else is random
    tokenizer = load_tokenizer(model_dir)
    return TorchGenerator(
        model_dir,
        sampling=gen_cfg.sampling(),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        threads=gen_cfg.threads,
        device=gen_cfg.device,
        dtype=_TORCH_DTYPES[gen_cfg.dtype],
    )


def _vllm(gen_cfg: GenerationConfig, model_dir: Path, seed: int) -> Generator:
    from harness.generators.vllm_backend import VLLMGenerator

    return VLLMGenerator(
        model_dir,
        sampling=gen_cfg.sampling(),
        eos_token_id=load_tokenizer(model_dir).eos_token_id,
        device=gen_cfg.device,
        dtype=gen_cfg.dtype,
        threads=gen_cfg.threads,
        seed=seed,
        gpu_memory_utilization=gen_cfg.gpu_memory_utilization,
        cpu_kvcache_space_gb=gen_cfg.cpu_kvcache_space_gb,
    )


# Backends are imported lazily: importing vLLM takes ~15 s and is pointless for the torch backend.
BACKENDS: dict[GeneratorBackend, Callable[[GenerationConfig, Path, int], Generator]] = {
    "torch": _torch,
    "vllm": _vllm,
}


def make_generator(gen_cfg: GenerationConfig, model_dir: str | Path, seed: int) -> Generator:
    """A generator for `model_dir` (version 0) sampling as `gen_cfg` says.

    `seed` is the trial seed; it only seeds engine-level defaults, since each sample is seeded by
    its own `sample_seed`. EOS and padding come from the model directory's tokenizer. In a warm
    generator process a vLLM engine is kept across trials (`kept_engines`).
    """
    model_dir = Path(model_dir)
    return kept_or_new(
        gen_cfg, model_dir, lambda: BACKENDS[gen_cfg.backend](gen_cfg, model_dir, seed)
    )
