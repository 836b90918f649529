"""The built-in character-level tokenizer: one token per character, fixed vocabulary.

A character vocabulary keeps the tiny built-in model honest: every task answer is spelled out
token by token, so the response length equals the answer length plus EOS and nothing depends on a
learned merge table. It is built with the `tokenizers` library and saved in Hugging Face format, so
`AutoTokenizer.from_pretrained(dir)` (and vLLM, which calls it) loads it offline.

Contract the rest of the harness relies on:
- `encode(text)` gives exactly one id per character, with or without `add_special_tokens`: there
  is no post-processor, so no BOS/EOS is ever added implicitly. Prompts therefore start with their
  first character; `<bos>` is in the vocabulary only because tooling expects one.
- A response ends with `<eos>`; `<pad>` is id 0 and never trained on.
- Characters outside the vocabulary map to `<unk>` (decode then shows `<unk>`; the round trip holds
  for in-vocabulary text only). The literal strings `<pad>`, `<bos>`, `<eos>`, `<unk>` in input
  text are read as the special tokens, as with any Hugging Face tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
# The special tokens by role, as the tokenizer is built with them and special_tokens_map.json
# records them.
CHAR_SPECIAL_TOKENS: Mapping[str, str] = MappingProxyType(
    {"pad_token": PAD_TOKEN, "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "unk_token": UNK_TOKEN}
)

# Digits and operators for arithmetic, lowercase letters for reverse/sort, then space, newline and
# common punctuation so simple user prompt files (task `file`) mostly stay in-vocabulary.
# Changing this string changes every id: bump harness.models.model_dir.FORMAT_VERSION with it.
CHARACTERS = "0123456789+*=-abcdefghijklmnopqrstuvwxyz .,:;!?'\"()/\n"


def char_vocab() -> dict[str, int]:
    """Token -> id: the four special tokens (pad = 0), then one id per character of CHARACTERS."""
    tokens = list(SPECIAL_TOKENS) + list(CHARACTERS)
    if len(set(tokens)) != len(tokens):
        raise AssertionError("tokenizer.CHARACTERS holds a duplicate character")
    return {token: index for index, token in enumerate(tokens)}


def build_char_tokenizer(model_max_length: int) -> PreTrainedTokenizerFast:
    """The character tokenizer as a Hugging Face fast tokenizer with pad/bos/eos/unk set.

    `model_max_length` is the model's context (prompt + response), recorded so that tooling which
    truncates by it (vLLM's max_model_len checks) sees the real limit.
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=char_level_backend(char_vocab(), UNK_TOKEN),
        **CHAR_SPECIAL_TOKENS,
        model_max_length=model_max_length,
        padding_side="right",
    )


def char_level_backend(vocab: dict[str, int], unk_token: str) -> Tokenizer:
    """A `tokenizers` pipeline with one token per character of `vocab`, decoded by concatenation.

    Shared with the tests' ChatML tokenizer, which adds its special tokens to the same scheme.
    """
    backend = Tokenizer(models.WordLevel(vocab, unk_token=unk_token))
    # `[\s\S]` (not `.`) so newlines are split into tokens too; "isolated" keeps every character.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse concatenates the token strings: the default decoder would join them with spaces.
    backend.decoder = decoders.Fuse()
    return backend


def save_tokenizer(
    tokenizer: PreTrainedTokenizerBase,
    directory: Path,
    *,
    special: Mapping[str, str] = CHAR_SPECIAL_TOKENS,
    chat_template: str | None = None,
) -> None:
    """Save in Hugging Face format: tokenizer.json, tokenizer_config.json, special_tokens_map.json.

    transformers 5 writes `tokenizer_class: TokenizersBackend`, a name transformers 4 cannot
    resolve; `PreTrainedTokenizerFast` loads under both, so the config is rewritten to it. The
    special-tokens map (`special`, in its order) is no longer written by transformers 5 but older
    loaders read it. A `chat_template` is also kept inline in tokenizer_config.json, where older
    loaders and vLLM look for it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if chat_template is not None:
        config["chat_template"] = chat_template
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(dict(special), indent=2) + "\n")


# tokenizer_config.json classes that mean "the pipeline is the one in tokenizer.json".
GENERIC_TOKENIZER_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})


def declared_tokenizer_class(directory: Path | str) -> str | None:
    """`tokenizer_class` of the directory's tokenizer_config.json, if it names one."""
    path = Path(directory) / "tokenizer_config.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("tokenizer_class")


def load_tokenizer(directory: Path | str) -> PreTrainedTokenizerBase:
    """Load any saved Hugging Face tokenizer offline (never touches a model hub).

    A directory whose tokenizer_config.json declares a generic class (the built-in tokenizer's
    `PreTrainedTokenizerFast`) is loaded as exactly that: transformers 5's AutoTokenizer swaps in
    the model type's own class for some types (qwen2 among them), and Qwen2's class rebuilds a
    byte-level pipeline that drops the character tokenizer's spaces and newlines. Any other
    directory goes through AutoTokenizer, as a downloaded model would.
    """
    if declared_tokenizer_class(directory) in GENERIC_TOKENIZER_CLASSES:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)
    else:
        # Imported here: AutoTokenizer loads transformers' model registry (about 1 s), which the
        # built-in tokenizer, and every supervisor that reads it, never needs.
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"tokenizer in {directory} has no pad token; set `pad_token` in its "
            "tokenizer_config.json (the harness pads batches with it)"
        )
    if tokenizer.eos_token_id is None:
        raise ValueError(
            f"tokenizer in {directory} has no eos token; responses end at EOS, so set "
            "`eos_token` in its tokenizer_config.json"
        )
    return tokenizer


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Prompt ids exactly as every component (warm start, generators, learner) must build them.

    No special tokens are added: with the built-in tokenizer this is one id per character, and a
    user tokenizer's BOS conventions are not silently mixed into the matched prompt stream.
    """
    return list(tokenizer.encode(text, add_special_tokens=False))


def response_text(tokenizer: PreTrainedTokenizerBase, response_ids: Sequence[int]) -> str:
    """A response as every verifier and reward function sees it, in rollouts and evals alike.

    Cut at the first EOS (generators stop on it; batched `generate` pads after it), then decoded
    with special tokens skipped, so `42<|im_end|>`, `42</s>` and `42<eos>` all read `42`. EOS
    decides `finish_reason` only, never the reward: a decode that kept it would make a response
    score differently in training and in eval.
    """
    ids = list(response_ids)
    if tokenizer.eos_token_id in ids:
        ids = ids[: ids.index(tokenizer.eos_token_id)]
    return tokenizer.decode(ids, skip_special_tokens=True)
