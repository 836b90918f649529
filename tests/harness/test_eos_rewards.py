"""Training and eval score a response ending in a special EOS alike (`42<|im_end|>` -> `42`).

A tiny Qwen2 on a ChatML tokenizer is taught (supervised, as the warm start does) to answer `42`
and stop with `<|im_end|>` on rendered chat prompts. The rollout path (the generator's
`GroupMaker`, torch backend) and the eval path (the eval suite the generators run, on a torch
copy and on the rollout engine) then run on the same model directory: both must render the chat
the same way and hand the verifier, or a user's reward function, the text `42` with the EOS
removed. Before EOS-consistent decoding the rollouts scored `42<|im_end|>` and got 0 while eval
gave 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from contract.trial import TrialSpec
from harness.config import ExperimentConfig
from harness.evaluation.suite import make_eval_suite
from harness.models.factory import load_policy
from harness.models.warm_start import answer_loss, pinned_threads, sft_batch
from harness.tasks.factory import make_rendered_task
from harness.trial.rollout_groups import GeneratorStats, GroupMaker
from tests.harness.chat_tokenizer import build_chat_tokenizer
from tests.tiny_models import TinyArch, TokenIds, tiny_model

MAX_SEQ_LEN = 64
SFT_STEPS = 250


def _chat(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(task file, model dir) with a model that answers `42<|im_end|>` to both prompts."""
    root = tmp_path_factory.mktemp("eos")
    task_file = root / "task.jsonl"
    rows = [
        {"prompt": _chat("Say 42."), "ground_truth": "42", "split": "train"},
        {"prompt": _chat("What is 6*7?"), "ground_truth": "42", "split": "test"},
    ]
    task_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tokenizer = build_chat_tokenizer(model_max_length=MAX_SEQ_LEN)
    config = ExperimentConfig(**_config(task_file, root)).task
    task = make_rendered_task(config, tokenizer)  # trained on the rendered text
    prompts = [task.train_prompt(0, 0), *task.eval_prompts(1)]
    assert prompts[0].text.startswith("<|im_start|>user\n")

    ids = TokenIds(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, bos=None)
    model = tiny_model(TinyArch(max_positions=MAX_SEQ_LEN, tie_embeddings=False), ids, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    input_ids, mask, labels = sft_batch(tokenizer, prompts, MAX_SEQ_LEN)
    with pinned_threads(1):
        for _ in range(SFT_STEPS):
            loss = answer_loss(model, input_ids, mask, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert loss.item() < 1e-3  # `4`, `2`, `<|im_end|>` each with probability > 0.999
    model_dir = root / "model"
    model.generation_config.do_sample = False
    model.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    return task_file, model_dir


def _config(task_file: Path, model_dir: Path, **task: str) -> dict:
    return {
        "arms": [{"name": "grpo", "objective": "grpo"}],
        "model": {"path": str(model_dir), "max_seq_len": MAX_SEQ_LEN},
        "task": {"name": "file", "path": str(task_file), "eval_size": 1, **task},
        "generation": {"backend": "torch", "group_size": 2, "max_new_tokens": 6},
        "learner": {"prompts_per_step": 1},
    }


@pytest.fixture
def exact_42_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "eos_user_reward.py").write_text(
        "def exact(response, ground_truth):\n"
        "    return float(response == ground_truth), {'seen': response}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "eos_user_reward:exact"
    sys.modules.pop("eos_user_reward", None)


@pytest.mark.parametrize("scorer", ["verifier", "reward_fn"])
def test_training_and_eval_rewards_agree_on_a_special_eos(setup, exact_42_module, scorer: str):
    task_file, model_dir = setup
    task = {"reward_fn": exact_42_module} if scorer == "reward_fn" else {"verifier": "exact"}
    cfg = ExperimentConfig(**_config(task_file, model_dir, **task))

    maker = GroupMaker(cfg, TrialSpec("grpo", 0, 0, "fixed"), "eos-run", "gen-0")
    suite = make_eval_suite(cfg, model_dir, trial_seed=0)
    try:
        (group,) = maker.make([0], version=0, stats=GeneratorStats())
        on_engine = suite.on_engine(maker.generator, 0)  # eval.engine: generator
    finally:
        maker.generator.close()
    eos = maker.tokenizer.eos_token_id
    assert group.finish_reasons == ["stop", "stop"]  # EOS decided how each response ended
    assert [ids[-1] for ids in group.response_ids] == [eos, eos]
    assert [maker.tokenizer.decode(ids) for ids in group.response_ids] == ["42<|im_end|>"] * 2
    assert group.rewards == [1.0, 1.0]  # ... but the reward saw `42`
    if scorer == "reward_fn":
        assert json.loads(group.reward_infos[0])["seen"] == "42"

    assert suite(load_policy(model_dir, torch.float32, "cpu"), 0).pass_rate == 1.0  # torch copy
    assert on_engine.pass_rate == 1.0
