"""The character tokenizer: one id per character, fixed special ids, offline HF round trip."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer

from harness.models.tokenizer import (
    BOS_ID,
    CHARACTERS,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    build_char_tokenizer,
    char_vocab,
    encode_prompt,
    load_tokenizer,
    save_tokenizer,
)

SAMPLE = "12+34=46 rev:abc=cba, sort:cab=abc!\n(x-y)*z"


def test_special_ids_and_vocab_order() -> None:
    vocab = char_vocab()
    assert (vocab["<pad>"], vocab["<bos>"], vocab["<eos>"], vocab["<unk>"]) == (0, 1, 2, 3)
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    # 4 specials then one id per character, in CHARACTERS order.
    assert vocab["0"] == 4
    assert len(vocab) == 4 + len(CHARACTERS)
    tokenizer = build_char_tokenizer(model_max_length=64)
    assert len(tokenizer) == len(vocab)
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)


def test_one_id_per_character_without_added_specials() -> None:
    tokenizer = build_char_tokenizer(model_max_length=64)
    vocab = char_vocab()
    for add_special_tokens in (True, False):
        ids = tokenizer.encode(SAMPLE, add_special_tokens=add_special_tokens)
        assert ids == [vocab[ch] for ch in SAMPLE]
    assert encode_prompt(tokenizer, "12+34=") == [5, 6, 14, 7, 8, 16]  # '0' is 4, '+' is 14


def test_every_character_round_trips() -> None:
    tokenizer = build_char_tokenizer(model_max_length=64)
    ids = encode_prompt(tokenizer, CHARACTERS)
    assert len(ids) == len(CHARACTERS)
    assert UNK_ID not in ids
    assert tokenizer.decode(ids) == CHARACTERS
    assert tokenizer.decode([*encode_prompt(tokenizer, "46"), EOS_ID, PAD_ID]) == "46<eos><pad>"
    assert tokenizer.decode(
        [*encode_prompt(tokenizer, "46"), EOS_ID], skip_special_tokens=True
    ) == ("46")


def test_unknown_characters_map_to_unk() -> None:
    tokenizer = build_char_tokenizer(model_max_length=64)
    assert encode_prompt(tokenizer, "aZb") == [char_vocab()["a"], UNK_ID, char_vocab()["b"]]


def test_save_and_load_offline_with_auto_tokenizer(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer(model_max_length=64)
    save_tokenizer(tokenizer, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / name).is_file(), name
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"

    loaded = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert loaded.encode(SAMPLE, add_special_tokens=True) == tokenizer.encode(SAMPLE)
    assert loaded.decode(loaded.encode(SAMPLE)) == SAMPLE
    assert (loaded.pad_token, loaded.bos_token, loaded.eos_token) == ("<pad>", "<bos>", "<eos>")
    assert loaded.model_max_length == 64
    assert load_tokenizer(tmp_path).get_vocab() == tokenizer.get_vocab()
