"""Prompt rendering: chats through the tokenizer's chat template, raw text otherwise, and the
rendered text is what the trial's prompt set stores and hashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.trial import TrialSpec
from harness.config import ExperimentConfig, TaskConfig
from harness.experiment.trial_runs import prompt_set_digest
from harness.models.tokenizer import build_char_tokenizer, encode_prompt
from harness.tasks.base import Prompt
from harness.tasks.factory import make_rendered_task, make_task
from harness.tasks.rendering import PromptRenderer
from harness.trial.prepare import prompt_table
from tests.harness.chat_tokenizer import IM_START, build_chat_tokenizer

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 6*7?"},
]
# CHAT through the ChatML template, generation prompt (the assistant turn's opening) added.
CHAT_RENDERED = (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nWhat is 6*7?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.fixture
def chat_file(tmp_path: Path) -> Path:
    rows = [
        {"prompt": CHAT, "ground_truth": "42", "split": "test"},
        {"prompt": [{"role": "user", "content": "What is 2+3?"}], "ground_truth": "5"},
        {"prompt": "1+1=", "ground_truth": "2"},
    ]
    rows[1]["split"] = rows[2]["split"] = "train"
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_chat_prompt_renders_through_the_template_with_generation_prompt(chat_file: Path):
    config = TaskConfig(name="file", path=str(chat_file), eval_size=1)
    prompt = make_rendered_task(config, build_chat_tokenizer()).eval_prompts(1)[0]
    assert prompt.text == CHAT_RENDERED
    assert prompt.ground_truth == "42"
    # The raw task keeps the chat and its newline-joined text (its identity for splits).
    raw = make_task(config).eval_prompts(1)[0]
    assert raw.text == "Be brief.\nWhat is 6*7?"
    assert raw.messages == (("system", "Be brief."), ("user", "What is 6*7?"))


def test_rendered_special_tokens_encode_as_single_ids() -> None:
    chat = build_chat_tokenizer()
    ids = encode_prompt(chat, CHAT_RENDERED)
    im_start = chat.convert_tokens_to_ids(IM_START)
    assert ids[0] == im_start  # `<|im_start|>` is one token, not 12 characters
    assert ids.count(im_start) == 3  # system, user, assistant
    assert ids.count(chat.eos_token_id) == 2  # `<|im_end|>` closes system and user turns


def test_plain_prompts_and_the_system_prompt() -> None:
    chat = build_chat_tokenizer()
    plain = Prompt(0, "1+1=", "2")
    templated = PromptRenderer(chat, "chat_template", system_prompt="Add.")
    assert templated.text(plain) == (
        "<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n1+1=<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    own_system = Prompt(1, "Be brief.\nWhat is 6*7?", "42", (("system", "Be brief."),))
    assert "Add." not in templated.text(own_system)  # the chat's own system turn wins
    assert PromptRenderer(chat, "chat_template").text(plain) == (
        "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n"
    )
    raw = PromptRenderer(chat, "raw", system_prompt="Add.")
    assert raw.format == "raw"
    assert raw.text(plain) == "Add.\n1+1="  # as the raw rendering of [system, user] reads
    assert PromptRenderer(chat, "raw").text(plain) == "1+1="


def test_auto_uses_the_template_only_when_the_tokenizer_has_one() -> None:
    assert PromptRenderer(build_chat_tokenizer(), "auto").format == "chat_template"
    char = build_char_tokenizer(model_max_length=64)  # the built-in tokenizer: no template
    assert PromptRenderer(char, "auto").format == "raw"
    task = make_rendered_task(TaskConfig(name="addition"), char)
    assert task.eval_prompts(5) == make_task(TaskConfig(name="addition")).eval_prompts(5)
    assert task.train_prompt(3, 7) == make_task(TaskConfig(name="addition")).train_prompt(3, 7)
    with pytest.raises(ValueError, match=r"task\.prompt_format=chat_template.*no chat template"):
        PromptRenderer(char, "chat_template")


def test_prompt_set_stores_and_hashes_the_rendered_text(chat_file: Path, tmp_path: Path):
    model_dir = tmp_path / "model"
    build_chat_tokenizer().save_pretrained(str(model_dir))

    def table(prompt_format: str):
        task = {"name": "file", "path": str(chat_file), "eval_size": 1}
        cfg = ExperimentConfig(
            arms=[{"name": "grpo", "objective": "grpo"}],
            task={**task, "prompt_format": prompt_format},
            learner={"prompts_per_step": 2},
        )
        return prompt_table(cfg, TrialSpec("grpo", 0, 0, "fixed"), 1, model_dir)

    rendered, raw = table("auto"), table("raw")
    eval_row = rendered[rendered["split"] == "eval"].iloc[0]
    assert eval_row["prompt"] == CHAT_RENDERED
    assert raw[raw["split"] == "eval"].iloc[0]["prompt"] == "Be brief.\nWhat is 6*7?"
    assert set(rendered[rendered["split"] == "train"]["prompt"]) == {
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n",
    }
    assert prompt_set_digest(rendered) != prompt_set_digest(raw)
