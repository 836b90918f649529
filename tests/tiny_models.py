"""The tiny random Qwen2 and Qwen3-MoE models of the tests and benchmarks, built in one place.

Two kinds of vocabulary: `RAW_IDS` (24 bare token ids; the learner tests feed ids directly) and
the built-in character tokenizer (`save_tiny_model_dir`: generator tests and benchmarks need a
tokenizer saved next to the weights, as the built-in model has). Every model is initialised from
its own seed inside a forked RNG, so building one never moves the caller's random stream, and
the same (arch, seed) always gives the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from harness.models.tokenizer import EOS_ID, PAD_ID, build_char_tokenizer, save_tokenizer


@dataclass(frozen=True)
class TinyArch:
    """Shape and init of a tiny model; `experts > 0` makes it a Qwen3-MoE, every layer sparse."""

    hidden: int = 32
    intermediate: int = 64  # the dense MLP's width; with experts, each expert's width
    layers: int = 1
    heads: int = 2
    kv_heads: int = 1
    max_positions: int = 64
    initializer_range: float = 0.02  # transformers' default; 0.2 gives far-from-uniform outputs
    tie_embeddings: bool = True
    experts: int = 0
    experts_per_token: int = 2


@dataclass(frozen=True)
class TokenIds:
    """Vocabulary size and special token ids written into the model config."""

    vocab_size: int
    pad: int
    eos: int
    bos: int | None


RAW_IDS = TokenIds(vocab_size=24, pad=0, eos=1, bos=2)

# The learner tests' policies (over RAW_IDS).
DENSE_POLICY = TinyArch()
# 4 experts, top-2, wide init: the router has clear preferences, so routing can visibly move.
MOE_POLICY = TinyArch(intermediate=32, layers=2, initializer_range=0.2, experts=4)

# The generator tests' models (over the character tokenizer). Wide init (std 0.2): temperature and
# top-p change the logprobs a lot, so a wrong renormalisation cannot hide inside a 1e-4 tolerance.
# Head size 64 / 2 = 32, the smallest vLLM's CPU attention supports.
CHAR_DENSE = TinyArch(
    hidden=64, intermediate=256, layers=2, initializer_range=0.2, tie_embeddings=False
)
# 8 experts of width 64 (a multiple of 32: vLLM's CPU experts need no padding), top-2.
CHAR_MOE = TinyArch(
    hidden=64, intermediate=64, layers=2, initializer_range=0.2, tie_embeddings=False, experts=8
)


def tiny_config(arch: TinyArch, ids: TokenIds = RAW_IDS) -> PretrainedConfig:
    """The transformers config of `arch`: Qwen2Config, or Qwen3MoeConfig when it has experts."""
    common = {
        "vocab_size": ids.vocab_size,
        "hidden_size": arch.hidden,
        "intermediate_size": arch.intermediate,
        "num_hidden_layers": arch.layers,
        "num_attention_heads": arch.heads,
        "num_key_value_heads": arch.kv_heads,
        "max_position_embeddings": arch.max_positions,
        "initializer_range": arch.initializer_range,
        "tie_word_embeddings": arch.tie_embeddings,
        "pad_token_id": ids.pad,
        "eos_token_id": ids.eos,
        "bos_token_id": ids.bos,
    }
    if not arch.experts:
        return Qwen2Config(**common)
    return Qwen3MoeConfig(
        **common,
        head_dim=arch.hidden // arch.heads,  # Qwen3's default head_dim is 128
        moe_intermediate_size=arch.intermediate,
        num_experts=arch.experts,
        num_experts_per_tok=arch.experts_per_token,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def tiny_model(arch: TinyArch = DENSE_POLICY, ids: TokenIds = RAW_IDS, seed: int = 0):
    """A float32 random-init model of `arch`, the same for the same seed."""
    model_class = Qwen3MoeForCausalLM if arch.experts else Qwen2ForCausalLM
    config = tiny_config(arch, ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: PreTrainedModel = model_class(config)
    return model.float()


def save_tiny_model_dir(path: Path, arch: TinyArch = CHAR_DENSE, seed: int = 0) -> Path:
    """A tiny model with the character tokenizer, saved like the built-in model; returns `path`."""
    tokenizer = build_char_tokenizer(model_max_length=arch.max_positions)
    ids = TokenIds(vocab_size=len(tokenizer), pad=PAD_ID, eos=EOS_ID, bos=None)
    tiny_model(arch, ids, seed).save_pretrained(str(path))
    save_tokenizer(tokenizer, path)
    return path
