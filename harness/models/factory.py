"""Model directories: build (and cache) the built-in model, or validate a user's model path.

The built-in model is a tiny Qwen2 (or Qwen3-MoE, or Mistral) causal LM with the character
tokenizer or Mistral 7B's production tokenizer (`model.tokenizer`, harness.models.mistral_vocab),
warm-started on the task, saved in Hugging Face format so the learner (transformers) and the
generators (vLLM or torch) load the very same files, exactly as they load a user's model. A
build is a pure function of its cache key (model config minus cache_dir, task settings,
FORMAT_VERSION, library versions), so it is built once into `cache_dir/<key>`: in a temporary
directory renamed into place when complete (readers never see half a model), under an fcntl lock
(concurrent trials wait instead of building twice).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
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

from contract.durable import file_digest
from contract.record import write_json_atomic
from harness.config import (
    ConfigError,
    ModelConfig,
    TaskConfig,
    check_response_fits,
    resolved_dump,
)
from harness.file_lock import file_lock
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
    "FORMAT_VERSION",
    "ModelPathError",
    "build_model_dir",
    "builtin_cache_key",
    "load_policy",
    "load_tokenizer",
    "weights_digest",
]

logger = logging.getLogger(__name__)

# Bump whenever the bytes a build produces change for the same config (tokenizer vocabulary, task
# generators, warm-start recipe, saved files), so stale cache entries are never reused.
FORMAT_VERSION = 2
# A warm start of the default config takes seconds; a large one minutes. Waiting longer than this
# for another process's build means that process is stuck.
LOCK_TIMEOUT_S = 1800.0
# Untied input/output embeddings (Qwen2's own default): the output head can learn answer-token
# statistics independently of the input embedding. Recorded in config.json.
TIE_WORD_EMBEDDINGS = False
ROPE_THETA = 10_000.0
INITIALIZER_RANGE = 0.02
WARM_START_FILE = "warm_start.json"
BUILD_INFO_FILE = "build_info.json"


def builtin_cache_key(model_cfg: ModelConfig, task_cfg: TaskConfig) -> str:
    """Hex digest of everything that determines the built-in model's files."""
    task: dict[str, Any] = resolved_dump(task_cfg)
    if task_cfg.name == "file" and task_cfg.path is not None:
        task["path_sha256"] = file_digest(Path(task_cfg.path).expanduser())
    else:
        task["path"] = None  # no effect on procedural tasks
    payload = {
        "model": model_cfg.model_dump(mode="json", exclude={"cache_dir"}),
        "task": task,
        "format_version": FORMAT_VERSION,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    canonical = json.dumps(payload, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


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


def build_builtin(model_cfg: ModelConfig, task_cfg: TaskConfig, out_dir: Path) -> None:
    """Initialise from `init_seed`, warm-start, and save model + tokenizer + reports to out_dir."""
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
        "format_version": FORMAT_VERSION,
        "cache_key": builtin_cache_key(model_cfg, task_cfg),  # not out_dir: a staging name
        "model": model_cfg.model_dump(mode="json", exclude={"cache_dir"}),
        "task": resolved_dump(task_cfg),
        "tie_word_embeddings": TIE_WORD_EMBEDDINGS,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    (out_dir / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def _build_cached(model_cfg: ModelConfig, task_cfg: TaskConfig) -> Path:
    cache_dir = Path(model_cfg.cache_dir).expanduser()
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = builtin_cache_key(model_cfg, task_cfg)
    final = cache_dir / key
    # An fcntl lock dies with its holder, so deleting the file would not free it (and would
    # let a second builder in): the holder is a live process, find it (`fuser <lock>`).
    building = "another live process building this model (find it with `fuser` on the lock)"
    with file_lock(cache_dir / f"{key}.lock", LOCK_TIMEOUT_S, building):
        if final.is_dir():  # renamed into place only when complete
            return final
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.building-", dir=cache_dir))
        try:
            logger.info("building built-in model %s (%s)", key, model_cfg.arch)
            build_builtin(model_cfg, task_cfg, staging)
            os.rename(staging, final)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    return final


class ModelPathError(ConfigError, FileNotFoundError):
    """model.path names no usable model directory. A ConfigError, so the command line prints it
    as one line naming the field instead of a traceback."""


def validate_model_dir(path: Path) -> Path:
    """A user model directory must hold config.json and tokenizer files the harness can load."""
    if not path.is_dir():
        missing = "" if path.exists() else " (nothing is there)"
        raise ModelPathError(
            f"model.path {path} is not a directory{missing}; set model.path to a local Hugging "
            "Face model directory or to `builtin`"
        )
    if not (path / "config.json").is_file():
        raise ModelPathError(f"model.path {path} has no config.json (not a Hugging Face model)")
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise ModelPathError(
            f"model.path {path} has no tokenizer.json/tokenizer_config.json; save the tokenizer "
            "next to the model (tokenizer.save_pretrained)"
        )
    return path


def check_model_context(path: Path, max_new_tokens: int) -> None:
    """generation.max_new_tokens must leave room for a prompt in the context that the model
    directory's config.json declares (`max_position_embeddings`, top level or `text_config`;
    a config without one is not checked)."""
    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelPathError(f"model.path {path}: cannot read config.json ({exc})") from None
    if not isinstance(config, dict):
        raise ModelPathError(f"model.path {path}: config.json does not hold a JSON object")
    text_config = config.get("text_config")
    nested = text_config if isinstance(text_config, dict) else {}
    context = config.get("max_position_embeddings", nested.get("max_position_embeddings"))
    if isinstance(context, int) and not isinstance(context, bool):
        try:
            check_response_fits(
                max_new_tokens,
                context,
                f"max_position_embeddings={context} in {config_file}",
                "lower generation.max_new_tokens",
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def build_model_dir(model_cfg: ModelConfig, task_cfg: TaskConfig) -> Path:
    """The model directory of a run: the cached built-in build, or the validated user path."""
    if model_cfg.path == "builtin":
        return _build_cached(model_cfg, task_cfg)
    return validate_model_dir(Path(model_cfg.path).expanduser())


def load_policy(
    model_dir: Path | str, dtype: torch.dtype | str, device: torch.device | str
) -> PreTrainedModel:
    """Load a causal LM offline in `dtype` on `device` (eval mode, as from_pretrained leaves it)."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, local_files_only=True)
    return model.to(device)


DIGEST_CACHE = ".weights_digest.json"  # hidden: never copied into weight versions or synced


def weights_digest(model_dir: Path | str) -> str:
    """sha256 over the safetensors files (names and bytes, sorted): equal digests, equal weights.

    The supervisor, the learner and every generator (at each restart) check a model by its
    digest; hashing 15 GB takes about 10 s, so the digest is cached beside the files, keyed by
    each file's name, size, mtime and inode (the rule `make` and rsync trust; a copy or an
    in-place rewrite changes one of them). A read-only model dir just goes uncached.
    """
    root = Path(model_dir)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    stats = []
    for path in files:
        info = path.stat()
        stats.append([path.name, info.st_size, info.st_mtime_ns, info.st_ino])
    cache = root / DIGEST_CACHE
    try:
        cached = json.loads(cache.read_text())
        if cached.get("files") == stats:
            return str(cached["digest"])
    except (OSError, ValueError, AttributeError):
        pass
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\x00")
        digest.update(bytes.fromhex(file_digest(path)))
    with contextlib.suppress(OSError):  # a read-only model dir (a shared mount): uncached
        write_json_atomic(cache, {"files": stats, "digest": digest.hexdigest()})
    return digest.hexdigest()
