"""The weight store: atomic version directories, self-contained for vLLM, pruning."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import buffer.weight_store as ws
from buffer.weight_store import WeightStore, read_state_dict


def tensors(value: float) -> dict[str, torch.Tensor]:
    return {"a.weight": torch.full((2, 3), value), "b.bias": torch.arange(4.0) + value}


@pytest.fixture
def base_dir(tmp_path: Path) -> Path:
    """A stand-in base model directory: config and tokenizer files next to weights."""
    base = tmp_path / "base"
    base.mkdir()
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        (base / name).write_text("{}")
    (base / "model.safetensors").write_bytes(b"old weights, never copied")
    (base / "model.safetensors.index.json").write_text("{}")
    return base


def test_write_makes_a_self_contained_version_dir(tmp_path: Path, base_dir: Path) -> None:
    store = WeightStore(tmp_path / "store")
    location = store.write(12, tensors(1.0), config_dir=base_dir)
    assert Path(location) == tmp_path / "store" / "v000012"
    assert sorted(p.name for p in Path(location).iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    loaded = read_state_dict(location)
    for name, tensor in tensors(1.0).items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0)
    assert [p.name for p in store.root.iterdir()] == ["v000012"]  # no temporary left behind
    assert store.path(12) == location and store.latest() == 12


def test_no_partial_directory_is_ever_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = WeightStore(tmp_path)
    final = tmp_path / "v000003"
    seen_before_rename = []
    real_fsync_dir = ws.fsync_dir

    def spy(path: Path) -> None:
        if path.name.startswith(".tmp-"):  # the staging dir is complete, not yet renamed
            seen_before_rename.append((final.exists(), store.latest()))
        real_fsync_dir(path)

    monkeypatch.setattr(ws, "fsync_dir", spy)
    store.write(3, tensors(3.0))
    assert seen_before_rename == [(False, None)]
    assert final.is_dir()


def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = WeightStore(tmp_path)

    def crash(state: dict, filename: str) -> None:
        Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(ws, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        store.write(5, tensors(5.0))
    assert list(tmp_path.iterdir()) == []
    assert store.latest() is None


def test_tied_weights_are_saved_once(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight  # tied, as tie_word_embeddings does
    location = WeightStore(tmp_path).write(0, model)
    assert sorted(read_state_dict(location)) == ["0.weight"]


def test_rewriting_a_version_replaces_it(tmp_path: Path) -> None:
    store = WeightStore(tmp_path)
    store.write(2, tensors(1.0))
    location = store.write(2, tensors(9.0))
    assert read_state_dict(location)["a.weight"][0, 0].item() == 9.0
    assert store.versions() == [2] and len(list(tmp_path.iterdir())) == 1


def test_prune_keeps_the_newest_and_the_protected(tmp_path: Path) -> None:
    store = WeightStore(tmp_path)
    for version in range(6):
        store.write(version, tensors(float(version)))
    (tmp_path / ".tmp-v000009-deadbeef").mkdir()  # a live writer's staging dir: not a version
    stale = tmp_path / ".tmp-v000008-0badf00d"  # left by a writer that died an hour ago
    stale.mkdir()
    os.utime(stale, (time.time() - 2 * ws.STALE_STAGING_S,) * 2)
    assert store.prune(keep=2, protect={0}) == [1, 2, 3]
    assert store.versions() == [0, 4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".tmp-v000009-deadbeef",
        "v000000",
        "v000004",
        "v000005",
    ]
    assert store.latest() == 5
    assert store.prune(keep=2, protect={0}) == []


def test_missing_versions_and_bad_arguments_say_what_to_do(tmp_path: Path) -> None:
    store = WeightStore(tmp_path)
    store.write(1, tensors(1.0))
    with pytest.raises(FileNotFoundError, match=r"no version 7 \(present: \[1\]\)"):
        store.path(7)
    with pytest.raises(ValueError, match="keep at least"):
        store.prune(keep=0)
    with pytest.raises(ValueError, match=">= 0"):
        store.write(-1, tensors(0.0))
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        read_state_dict(tmp_path)
