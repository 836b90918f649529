"""Model directories: build (and cache) the built-in model, or validate a user's model path.

The built-in model is a tiny Qwen2 (or Qwen3-MoE, or Mistral) causal LM with the character
tokenizer or Mistral 7B's production tokenizer (`model.tokenizer`, harness.models.mistral_vocab),
warm-started on the task, saved in Hugging Face format so the learner (transformers) and the
generators (vLLM or torch) load the very same files, exactly as they load a user's model. A
build is a pure function of its cache key (model config minus cache_dir, task settings,
FORMAT_VERSION, library versions), so it is built once into `cache_dir/<key>`
(`harness.models.model_dir`, which finds a build without importing this module).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from harness.config import (
    ModelConfig,
    TaskConfig,
    resolved_dump,
)
from harness.models.chat_warm_start import chat_warm_start
from harness.models.mistral_vocab import build_mistral_tokenizer, save_mistral_tokenizer
from harness.models.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    build_char_tokenizer,
    load_tokenizer,
    save_tokenizer,
)
from harness.models.warm_start import WarmStartReport, warm_start
from harness.tasks.factory import make_rendered_task, make_task
from harness.tasks.rendering import renderer_for
from harness.tasks.rewards import make_reward_fn

__all__ = [
    "ARCHITECTURES",
    "TOKENIZERS",
    "build_builtin",
    "load_policy",
    "load_tokenizer",
    "special_ids",
]

logger = logging.getLogger(__name__)

# Untied input/output embeddings (Qwen2's own default): the output head can learn answer-token
# statistics independently of the input embedding. Recorded in config.json.
TIE_WORD_EMBEDDINGS = False
ROPE_THETA = 10_000.0
INITIALIZER_RANGE = 0.02
WARM_START_FILE = "warm_start.json"
BUILD_INFO_FILE = "build_info.json"


@dataclass(frozen=True)
class SpecialIds:
    """The tokenizer's BOS / EOS / pad ids, recorded in config.json."""

    bos: int
    eos: int
    pad: int


CHAR_SPECIAL_IDS = SpecialIds(bos=BOS_ID, eos=EOS_ID, pad=PAD_ID)


def special_ids(tokenizer: PreTrainedTokenizerBase) -> SpecialIds:
    return SpecialIds(tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)


def _common_arch(cfg: ModelConfig, vocab_size: int, ids: SpecialIds) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "max_position_embeddings": cfg.max_seq_len,
        "rope_theta": ROPE_THETA,
        "initializer_range": INITIALIZER_RANGE,
        "tie_word_embeddings": TIE_WORD_EMBEDDINGS,
        "bos_token_id": ids.bos,
        "eos_token_id": ids.eos,
        "pad_token_id": ids.pad,
    }


def qwen2_config(
    cfg: ModelConfig, vocab_size: int, ids: SpecialIds = CHAR_SPECIAL_IDS
) -> PretrainedConfig:
    return Qwen2Config(**_common_arch(cfg, vocab_size, ids), use_sliding_window=False)


def mistral_config(
    cfg: ModelConfig, vocab_size: int, ids: SpecialIds = CHAR_SPECIAL_IDS
) -> PretrainedConfig:
    """Mistral 7B's layout (GQA, RMSNorm, SwiGLU, RoPE), full attention (no sliding window)."""
    return MistralConfig(
        **_common_arch(cfg, vocab_size, ids),
        head_dim=cfg.hidden_size // cfg.num_heads,
        sliding_window=None,
    )


def qwen3_moe_config(
    cfg: ModelConfig, vocab_size: int, ids: SpecialIds = CHAR_SPECIAL_IDS
) -> PretrainedConfig:
    """Every layer sparse; each expert as wide as the dense MLP (`intermediate_size`)."""
    return Qwen3MoeConfig(
        **_common_arch(cfg, vocab_size, ids),
        use_sliding_window=False,
        head_dim=cfg.hidden_size // cfg.num_heads,  # Qwen3's default head_dim is 128
        num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.experts_per_token,
        moe_intermediate_size=cfg.intermediate_size,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        output_router_logits=False,  # the learner asks for router logits when it needs them
    )


ARCHITECTURES: dict[str, tuple[Callable[..., PretrainedConfig], type]] = {
    "qwen2": (qwen2_config, Qwen2ForCausalLM),
    "qwen3_moe": (qwen3_moe_config, Qwen3MoeForCausalLM),
    "mistral": (mistral_config, MistralForCausalLM),
}
# model.tokenizer -> (build(model_max_length), save(tokenizer, directory)).
TOKENIZERS: dict[str, tuple[Callable[[int], Any], Callable[[Any, Path], None]]] = {
    "char": (lambda n: build_char_tokenizer(model_max_length=n), save_tokenizer),
    "mistral-v1": (build_mistral_tokenizer, save_mistral_tokenizer),
}


def _warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    model_cfg: ModelConfig,
    task_cfg: TaskConfig,
) -> WarmStartReport:
    """Character tokenizer: SFT on the task's answers; a chat tokenizer: on rendered prompts."""
    reward_fn = make_reward_fn(task_cfg)
    if model_cfg.tokenizer == "char":
        task = make_rendered_task(task_cfg, tokenizer)
        return warm_start(
            model, tokenizer, task, reward_fn, config=model_cfg, eval_size=task_cfg.eval_size
        )
    renderer = renderer_for(task_cfg, tokenizer)  # as make_rendered_task renders
    return chat_warm_start(
        model,
        tokenizer,
        make_task(task_cfg),
        renderer,
        reward_fn,
        model_cfg=model_cfg,
        task_cfg=task_cfg,
    )


def build_builtin(
    model_cfg: ModelConfig, task_cfg: TaskConfig, out_dir: Path, build_info: dict[str, Any]
) -> None:
    """Initialise from `init_seed`, warm-start, and save model + tokenizer + reports to out_dir.
    `build_info`: what the cache records of the build (its key, format version), written to
    build_info.json with what only the build knows."""
    build_tokenizer, save = TOKENIZERS[model_cfg.tokenizer]
    tokenizer = build_tokenizer(model_cfg.max_seq_len)
    make_config, model_class = ARCHITECTURES[model_cfg.arch]
    hf_config = make_config(model_cfg, len(tokenizer), special_ids(tokenizer))
    with torch.random.fork_rng(devices=[]):  # caller's RNG state is restored afterwards
        torch.manual_seed(model_cfg.init_seed)
        model = model_class(hf_config)
        report = _warm_start(model, tokenizer, model_cfg, task_cfg)
    model.generation_config.do_sample = False  # no sampling defaults leak into vLLM/generate
    model.save_pretrained(str(out_dir))
    save(tokenizer, out_dir)
    (out_dir / WARM_START_FILE).write_text(json.dumps(report.to_json_dict(), indent=2) + "\n")
    info = {
        **build_info,
        "model": model_cfg.model_dump(mode="json", exclude={"cache_dir"}),
        "task": resolved_dump(task_cfg),
        "tie_word_embeddings": TIE_WORD_EMBEDDINGS,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    (out_dir / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def load_policy(
    model_dir: Path | str, dtype: torch.dtype | str, device: torch.device | str
) -> PreTrainedModel:
    """Load a causal LM offline in `dtype` on `device` (eval mode, as from_pretrained leaves it)."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, local_files_only=True)
    return model.to(device)
