"""The character tokenizer: one id per character, fixed special ids, offline HF round trip; and
the response text every verifier sees."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer, Qwen2Config

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
    response_text,
    save_tokenizer,
)
from tests.harness.chat_tokenizer import IM_END, IM_START, build_chat_tokenizer

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


def test_response_text_drops_eos_and_what_follows() -> None:
    char = build_char_tokenizer(model_max_length=64)
    answer = encode_prompt(char, "46")
    assert response_text(char, [*answer, EOS_ID]) == "46"  # a generator's stopped response
    assert response_text(char, [*answer, EOS_ID, PAD_ID, PAD_ID]) == "46"  # batched generate
    assert response_text(char, [*answer, EOS_ID, *encode_prompt(char, "9")]) == "46"
    assert response_text(char, answer) == "46"  # cut by the length limit: no EOS


def test_response_text_strips_an_instruct_tokenizers_special_tokens() -> None:
    # `<|im_end|>` is this tokenizer's EOS; a decode keeping special tokens shows it as text,
    # which the built-in normaliser (it knew only `<eos>`) left in the scored answer.
    chat = build_chat_tokenizer()
    answer = encode_prompt(chat, "42")
    assert chat.decode([*answer, chat.eos_token_id]) == f"42{IM_END}"
    assert response_text(chat, [*answer, chat.eos_token_id]) == "42"
    im_start = chat.convert_tokens_to_ids(IM_START)
    assert response_text(chat, [im_start, *answer]) == "42"  # other special tokens removed too


def test_load_tokenizer_keeps_the_saved_pipeline_next_to_a_qwen2_config(tmp_path: Path) -> None:
    # transformers 5's AutoTokenizer swaps in Qwen2's own tokenizer class for model type qwen2
    # (the built-in model's), whose byte-level pipeline dropped spaces and newlines: `a b\nc`
    # came back as `abc`, so generators encoded file prompts unlike the warm start.
    save_tokenizer(build_char_tokenizer(model_max_length=64), tmp_path)
    Qwen2Config(vocab_size=len(CHARACTERS) + 4).save_pretrained(str(tmp_path))
    loaded = load_tokenizer(tmp_path)
    reference = build_char_tokenizer(model_max_length=64)
    assert encode_prompt(loaded, SAMPLE) == encode_prompt(reference, SAMPLE)
    assert loaded.decode(encode_prompt(loaded, "a b\nc")) == "a b\nc"
    chat_dir = tmp_path / "chat"  # saved by transformers 5 as `TokenizersBackend`
    build_chat_tokenizer().save_pretrained(str(chat_dir))
    Qwen2Config(vocab_size=100).save_pretrained(str(chat_dir))
    chat = load_tokenizer(chat_dir)
    assert chat.decode(encode_prompt(chat, "Say 42.\n")) == "Say 42.\n"
    assert chat.chat_template is not None
