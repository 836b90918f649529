"""Model factory: deterministic cached builds, HF round trips, user paths, the greedy eval."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from buffer.weight_store import WeightStore
from harness.config import ModelConfig, TaskConfig
from harness.models import factory as model_factory
from harness.models.factory import ARCHITECTURES, load_policy, load_tokenizer
from harness.models.model_dir import (
    DIGEST_CACHE,
    build_model_dir,
    builtin_cache_key,
    weights_digest,
)
from harness.models.tokenizer import build_char_tokenizer, save_tokenizer
from harness.models.warm_start import (
    IGNORE_INDEX,
    generate_responses,
    greedy_eval,
    lr_factor,
    sft_batch,
)
from harness.tasks.base import Prompt
from harness.tasks.factory import make_task
from harness.tasks.rewards import integer_match

TASK = TaskConfig(name="addition", digits=2, eval_size=8)


def tiny(cache_dir: Path, **overrides: object) -> ModelConfig:
    fields = {
        "hidden_size": 16,
        "num_layers": 1,
        "num_heads": 2,
        "num_kv_heads": 1,
        "intermediate_size": 32,
        "max_seq_len": 32,
        "warm_start_steps": 3,
        "warm_start_batch_size": 8,
        "cache_dir": str(cache_dir),
    }
    return ModelConfig(**{**fields, **overrides})


def test_qwen_classes_import() -> None:
    # Fails when a broken torchvision/torchaudio build is installed next to torch.
    from transformers import Qwen2ForCausalLM, Qwen3MoeForCausalLM

    assert Qwen2ForCausalLM.__name__ and Qwen3MoeForCausalLM.__name__


def test_builds_are_deterministic_and_cached(tmp_path: Path) -> None:
    rng_before = torch.random.get_rng_state()
    threads_before = torch.get_num_threads()
    first = build_model_dir(tiny(tmp_path / "a"), TASK)
    second = build_model_dir(tiny(tmp_path / "b"), TASK)
    assert first.name == second.name  # the key ignores cache_dir
    assert weights_digest(first) == weights_digest(second)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # fork_rng kept our state
    assert torch.get_num_threads() == threads_before
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "warm_start.json",
        "build_info.json",
    ):
        assert (first / name).is_file(), name
    assert json.loads((first / "build_info.json").read_text())["cache_key"] == first.name
    report = json.loads((first / "warm_start.json").read_text())
    assert report["steps"] == 3 and report["eval_n"] == 8
    assert 0.0 <= report["greedy_pass_rate"] <= 1.0
    config = json.loads((first / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["tie_word_embeddings"] is False
    assert config["vocab_size"] == len(load_tokenizer(first))

    other_seed = build_model_dir(tiny(tmp_path / "a", init_seed=1), TASK)
    assert other_seed != first and weights_digest(other_seed) != weights_digest(first)


def test_cache_hit_does_not_rebuild(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = build_model_dir(tiny(tmp_path), TASK)

    def fail(*_: object) -> None:
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(model_factory, "build_builtin", fail)
    assert build_model_dir(tiny(tmp_path), TASK) == built
    assert not list(tmp_path.glob(".*building*"))  # staging directory was renamed away


def test_concurrent_requests_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # flock locks belong to open file descriptions, so two threads contend like two processes.
    calls: list[Path] = []
    real_build = model_factory.build_builtin

    def counting(
        model_cfg: ModelConfig, task_cfg: TaskConfig, out_dir: Path, info: dict[str, object]
    ) -> None:
        calls.append(out_dir)
        real_build(model_cfg, task_cfg, out_dir, info)

    monkeypatch.setattr(model_factory, "build_builtin", counting)
    results: list[Path] = []
    workers = [
        threading.Thread(target=lambda: results.append(build_model_dir(tiny(tmp_path), TASK)))
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert len(calls) == 1 and len(results) == 2 and results[0] == results[1]


def test_cache_key_covers_task_and_model(tmp_path: Path) -> None:
    base = builtin_cache_key(tiny(tmp_path), TASK)
    assert builtin_cache_key(tiny(tmp_path / "elsewhere"), TASK) == base
    assert builtin_cache_key(tiny(tmp_path, warm_start_steps=4), TASK) != base
    assert builtin_cache_key(tiny(tmp_path), TASK.model_copy(update={"digits": 3})) != base
    assert builtin_cache_key(tiny(tmp_path), TASK.model_copy(update={"name": "sort"})) != base


def test_model_and_tokenizer_round_trip(tmp_path: Path) -> None:
    config = tiny(tmp_path)
    tokenizer = build_char_tokenizer(config.max_seq_len)
    make_config, model_class = ARCHITECTURES["qwen2"]
    torch.manual_seed(0)
    model = model_class(make_config(config, len(tokenizer))).eval()
    model.save_pretrained(str(tmp_path / "m"))
    save_tokenizer(tokenizer, tmp_path / "m")

    loaded = load_policy(tmp_path / "m", dtype=torch.float32, device="cpu")
    ids = torch.tensor([load_tokenizer(tmp_path / "m").encode("12+34=46")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_moe_build_loads(tmp_path: Path) -> None:
    config = tiny(tmp_path, arch="qwen3_moe", num_experts=4, experts_per_token=2)
    model_dir = build_model_dir(config, TASK)
    hf_config = json.loads((model_dir / "config.json").read_text())
    assert hf_config["model_type"] == "qwen3_moe"
    assert hf_config["num_experts_per_tok"] == 2 and hf_config["head_dim"] == 8
    model = load_policy(model_dir, dtype=torch.float32, device="cpu")
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert model.config.num_experts == 4


def test_user_model_path_is_validated(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a directory"):
        build_model_dir(ModelConfig(path=str(tmp_path / "missing")), TASK)
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        build_model_dir(ModelConfig(path=str(tmp_path)), TASK)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        build_model_dir(ModelConfig(path=str(tmp_path)), TASK)
    save_tokenizer(build_char_tokenizer(32), tmp_path)
    assert build_model_dir(ModelConfig(path=str(tmp_path)), TASK) == tmp_path


def test_sft_batch_labels_only_answer_and_eos() -> None:
    tokenizer = build_char_tokenizer(32)
    prompts = [Prompt(0, "1+2=", "3"), Prompt(1, "10+20=", "30")]
    input_ids, mask, labels = sft_batch(tokenizer, prompts, max_seq_len=32)
    # Row 0: "1+2=" (4) + "3" + EOS = 6 tokens, padded to row 1's 6 + 2 + 1 = 9.
    assert input_ids.shape == (2, 9)
    assert mask[0].tolist() == [1] * 6 + [0] * 3
    assert labels[0].tolist() == [IGNORE_INDEX] * 4 + [7, 2] + [IGNORE_INDEX] * 3  # '3' is id 7
    assert labels[1].tolist() == [IGNORE_INDEX] * 6 + [7, 4, 2]  # "30" then EOS
    assert input_ids[0, 6:].tolist() == [0, 0, 0]  # pad id


def test_lr_factor_warms_up_then_stays_constant() -> None:
    assert lr_factor(0) == pytest.approx(1 / 50)  # WARMUP_STEPS = 50
    assert lr_factor(49) == 1.0 and lr_factor(10_000) == 1.0


def test_batched_greedy_equals_one_by_one(tmp_path: Path) -> None:
    model_dir = build_model_dir(tiny(tmp_path), TASK)
    model = load_policy(model_dir, dtype=torch.float32, device="cpu")
    tokenizer = load_tokenizer(model_dir)
    # Different prompt lengths exercise the left padding.
    prompts = [Prompt(0, "1+2=", "3"), Prompt(1, "12+34=", "46"), Prompt(2, "123+4=", "127")]
    options = {"max_new_tokens": 5, "do_sample": False, "temperature": 1.0}
    batched = generate_responses(model, tokenizer, prompts, **options)
    single = [generate_responses(model, tokenizer, [p], **options)[0] for p in prompts]
    assert batched == single

    eval_prompts = make_task(TASK).eval_prompts(8)
    result = greedy_eval(
        model, tokenizer, integer_match, eval_prompts, max_new_tokens=4, batch_size=3
    )
    assert result.n == 8 and 0.0 <= result.pass_rate <= 1.0
    default_batch = greedy_eval(model, tokenizer, integer_match, eval_prompts, max_new_tokens=4)
    assert default_batch.pass_rate == result.pass_rate  # batch size changes nothing
    perfect = greedy_eval(model, tokenizer, lambda r, t: (1.0, {}), eval_prompts, max_new_tokens=4)
    assert perfect.pass_rate == 1.0 and perfect.reward_mean == 1.0


def test_the_weights_digest_is_cached_beside_the_files_and_follows_them(tmp_path: Path) -> None:
    """Every component start hashes the model; the cache makes that one hash per model. It is
    keyed by size, mtime and inode: a rewrite is seen, a rewrite that forges size and mtime is
    what it cannot see (so the test uses one to prove the cache is what answered)."""
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    save_file({"w": torch.arange(6, dtype=torch.float32)}, str(weights))
    first = weights_digest(model)
    assert (model / DIGEST_CACHE).is_file()
    stat = weights.stat()
    forged = bytearray(weights.read_bytes())
    forged[-1] ^= 1  # same size
    weights.write_bytes(bytes(forged))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime, same inode
    assert weights_digest(model) == first  # answered by the cache
    os.utime(weights)  # an ordinary rewrite moves the mtime: hashed again
    assert weights_digest(model) != first

    blocked = tmp_path / "blocked"  # a cache that cannot be written (read-only mount; as
    shutil.copytree(model, blocked)  # root, chmod would not stop us): hashed every time
    (blocked / DIGEST_CACHE).unlink()
    (blocked / DIGEST_CACHE).mkdir()
    assert weights_digest(blocked) == weights_digest(blocked) == weights_digest(model)
    assert not list(blocked.glob("*.tmp"))

    version = WeightStore(tmp_path / "store").write(1, {"w": torch.ones(2)}, config_dir=model)
    assert not (Path(version) / DIGEST_CACHE).exists()  # never copied into a weight version
