"""A small instruct-style tokenizer for tests: ChatML markup, `<|im_end|>` as a special EOS.

Built locally with the `tokenizers` library (no model hub): one token per character, like the
built-in tokenizer, plus the special tokens and chat template of a Qwen-style instruct model, so
tests can check what the built-in tokenizer cannot show: a chat template with a generation
prompt, and an EOS whose text (`<|im_end|>`) is not the built-in `<eos>`.
"""

from __future__ import annotations

import string

from transformers import PreTrainedTokenizerFast

from harness.models.tokenizer import char_level_backend

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK = "<unk>"
CHARACTERS = string.ascii_letters + string.digits + " \n.,:;!?'\"()/+-*=#$\\{}^_"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_chat_tokenizer(model_max_length: int = 128) -> PreTrainedTokenizerFast:
    """ChatML tokenizer: pad `<|endoftext|>` (id 0), `<|im_start|>` (1), EOS `<|im_end|>` (2)."""
    tokens = [PAD, IM_START, IM_END, UNK, *dict.fromkeys(CHARACTERS)]
    return PreTrainedTokenizerFast(
        tokenizer_object=char_level_backend({t: i for i, t in enumerate(tokens)}, UNK),
        pad_token=PAD,
        eos_token=IM_END,
        unk_token=UNK,
        additional_special_tokens=[IM_START],
        chat_template=CHATML_TEMPLATE,
        model_max_length=model_max_length,
    )
