"""A causal LM's shape, read from its Hugging Face config.json, and its parameter counts.

The counts follow transformers' own modules (transformers 5, `modeling_qwen2.py`,
`modeling_qwen3_moe.py`, ...), term by term, so a shape's `parameters()` equals
`sum(p.numel() for p in model.parameters())` of the model `from_config` builds (checked in
tests/harness/test_plan.py for a dense and two MoE families):

- attention: q, k, v, o projections (q/k/v biases in Qwen2, `attention_bias` elsewhere),
  Qwen3's per-head q/k RMSNorms;
- MLP: gate, up, down (SwiGLU); an MoE layer instead has a router [experts, hidden], every
  expert's gate/up/down, and a shared expert (Qwen2-MoE's, with its sigmoid gate, or DeepSeek-
  style `n_shared_experts`);
- two RMSNorms per block, the final norm, the token embedding and, unless tied, the output head.

All experts count for memory; an MoE layer's activations use the `active` ones per token.
Multi-head latent attention (DeepSeek-V2/V3, `kv_lora_rank`) is not modelled and is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.overrides import ConfigError

QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe"})
"""Model types whose attention normalises q and k per head (RMSNorm of head_dim each)."""
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
"""config.json spellings of the routed-expert count (Qwen, Mixtral, DeepSeek/GLM)."""
KNOWN_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral", "qwen2_moe", "qwen3_moe", "mixtral"})
"""Model types whose modules the counts follow exactly; others are counted as a Llama-style
decoder (a note says so)."""


@dataclass(frozen=True)
class MoEShape:
    """The sparse MLP of an MoE model's sparse layers."""

    experts: int  # routed experts per sparse layer
    active: int  # experts each token is routed to (top-k)
    expert_intermediate: int  # each routed expert's MLP width
    sparse_layers: int  # decoder layers whose MLP is sparse (the others are dense)
    shared_intermediate: int = 0  # the shared expert's MLP width; 0: none
    shared_gate: bool = False  # Qwen2-MoE's sigmoid gate [1, hidden] on the shared expert


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on: sizes and the few layout switches that change parameter counts."""

    name: str
    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (every layer of a dense model)
    tied_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    moe: MoEShape | None = None

    @property
    def dense_layers(self) -> int:
        return self.layers - (self.moe.sparse_layers if self.moe else 0)

    def attention_parameters(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        weights = self.hidden * (q + 2 * kv) + q * self.hidden  # q, k, v, o
        biases = (q + 2 * kv if self.qkv_bias else 0) + (self.hidden if self.o_bias else 0)
        return weights + biases + (2 * self.head_dim if self.qk_norm else 0)

    def dense_mlp_parameters(self, width: int | None = None) -> int:
        width = self.intermediate if width is None else width
        bias = 2 * width + self.hidden if self.mlp_bias else 0
        return 3 * self.hidden * width + bias  # gate, up, down

    def sparse_mlp_parameters(self) -> int:
        assert self.moe is not None
        moe = self.moe
        experts = moe.experts * 3 * self.hidden * moe.expert_intermediate
        shared = 3 * self.hidden * moe.shared_intermediate + (self.hidden if moe.shared_gate else 0)
        return moe.experts * self.hidden + experts + shared  # router, experts, shared expert

    def block_parameters(self, sparse: bool) -> int:
        """One decoder block: attention, its MLP (sparse or dense) and its two RMSNorms."""
        mlp = self.sparse_mlp_parameters() if sparse else self.dense_mlp_parameters()
        return self.attention_parameters() + mlp + 2 * self.hidden

    def largest_block(self) -> int:
        """The largest decoder block (one FSDP unit)."""
        return max(self.block_parameters(sparse) for sparse, _ in self.block_kinds())

    def block_kinds(self) -> list[tuple[bool, int]]:
        """(sparse, number of such blocks), for each kind the model has."""
        sparse = self.moe.sparse_layers if self.moe else 0
        kinds = [(False, self.layers - sparse), (True, sparse)]
        return [(kind, count) for kind, count in kinds if count]

    def root_parameters(self) -> int:
        """Outside the blocks: embedding, final norm and (untied) output head, the FSDP root."""
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.vocab * self.hidden + self.hidden + head

    def parameters(self) -> int:
        blocks = sum(count * self.block_parameters(sparse) for sparse, count in self.block_kinds())
        return self.root_parameters() + blocks

    def largest_tensor(self) -> int:
        """The most elements of one parameter tensor: the embedding or head, a dense MLP's
        projection, or a sparse layer's experts, which transformers stores fused (the gate and
        up projections of every expert in one [experts, 2 x width, hidden] tensor)."""
        sizes = [self.vocab * self.hidden, self.heads * self.head_dim * self.hidden]
        if any(not sparse for sparse, _ in self.block_kinds()):
            sizes.append(self.intermediate * self.hidden)
        if self.moe is not None:
            sizes.append(self.moe.experts * 2 * self.moe.expert_intermediate * self.hidden)
        return max(sizes)

    def head_parameters(self) -> int:
        """The output head's own parameters (0 when tied to the embedding)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def active_parameters(self) -> int:
        """Parameters a token passes through (routed experts counted `active` times)."""
        if self.moe is None:
            return self.parameters()
        idle = self.moe.experts - self.moe.active
        return self.parameters() - self.moe.sparse_layers * idle * 3 * self.hidden * (
            self.moe.expert_intermediate
        )


def _int(config: dict[str, Any], key: str, source: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise ConfigError(f"{source} has no {key}; it is needed to plan memory")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{source}: {key}={value!r} is not a non-negative integer")
    return value


def _sparse_layers(config: dict[str, Any], layers: int) -> int:
    """How many blocks are sparse: Qwen's `decoder_sparse_step`/`mlp_only_layers`, DeepSeek's
    `first_k_dense_replace`/`moe_layer_freq`, else (Mixtral) every block."""
    if "decoder_sparse_step" in config or "mlp_only_layers" in config:
        step = config.get("decoder_sparse_step") or 1
        dense = set(config.get("mlp_only_layers") or [])
        return sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    first_dense = config.get("first_k_dense_replace") or 0
    every = config.get("moe_layer_freq") or 1
    return sum(1 for i in range(layers) if i >= first_dense and i % every == 0)


def _moe_shape(config: dict[str, Any], layers: int, source: str) -> MoEShape | None:
    experts = next((config[key] for key in EXPERT_COUNT_KEYS if config.get(key)), 0)
    if not experts:
        return None
    width_key = (
        "moe_intermediate_size" if "moe_intermediate_size" in config else "intermediate_size"
    )
    expert_width = _int(config, width_key, source)
    shared = config.get("shared_expert_intermediate_size") or 0
    shared_gate = bool(shared)  # Qwen2-MoE gates its shared expert
    if not shared and config.get("n_shared_experts"):
        shared = int(config["n_shared_experts"]) * expert_width
    return MoEShape(
        experts=int(experts),
        active=_int(config, "num_experts_per_tok", source),
        expert_intermediate=expert_width,
        sparse_layers=_sparse_layers(config, layers),
        shared_intermediate=int(shared),
        shared_gate=shared_gate,
    )


def shape_from_hf_config(config: dict[str, Any], name: str, source: str) -> ModelShape:
    """The shape of a config.json's model (a multimodal config's `text_config` when the top
    level has no hidden_size); `source` names the file in errors."""
    text = config.get("text_config")
    if "hidden_size" not in config and isinstance(text, dict):
        config = text
    if config.get("kv_lora_rank"):
        raise ConfigError(
            f"{source}: multi-head latent attention (kv_lora_rank, DeepSeek-V2/V3) is not "
            "modelled by `harness plan`"
        )
    model_type = str(config.get("model_type", ""))
    hidden, heads = _int(config, "hidden_size", source), _int(config, "num_attention_heads", source)
    layers = _int(config, "num_hidden_layers", source)
    moe = _moe_shape(config, layers, source)
    needs_dense_width = moe is None or moe.sparse_layers < layers
    attention_bias = bool(config.get("attention_bias", False))
    qkv_bias = {"qwen2": True, "qwen2_moe": bool(config.get("qkv_bias", True))}.get(
        model_type, attention_bias
    )
    return ModelShape(
        name=name,
        model_type=model_type,
        vocab=_int(config, "vocab_size", source),
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=_int(config, "num_key_value_heads", source, default=heads),
        head_dim=_int(config, "head_dim", source, default=hidden // max(heads, 1)),
        intermediate=_int(config, "intermediate_size", source, None if needs_dense_width else 0),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        o_bias=attention_bias and model_type not in {"qwen2", "qwen2_moe"},
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=model_type in QK_NORM_TYPES,
        moe=moe,
    )


def read_hf_config(path: Path) -> tuple[dict[str, Any], Path]:
    """A config.json (or a model directory holding one) as a dict, and the file read."""
    file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{file} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {file} ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{file} does not hold a JSON object")
    return config, file


def load_shape(path: Path) -> ModelShape:
    """The shape of the model whose config.json is `path` (or is in directory `path`)."""
    config, file = read_hf_config(path)
    name = file.parent.name if file.name == "config.json" else file.stem
    return shape_from_hf_config(config, name, str(file))
