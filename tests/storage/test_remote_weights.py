"""Weight versions through the bucket: uploaded before they are announced, fetched on demand.

A generator on another node loads the learner's weights only from the bucket; the `_COMPLETE`
marker is what keeps it from loading half a version, and pruning in the bucket (not only on the
learner's disk) is what keeps a long run from filling it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from buffer.weight_store import WEIGHTS_FILE, read_state_dict
from harness.storage.remote_tree import RemoteTree
from harness.storage.remote_weights import (
    COMPLETE,
    RemoteWeightStore,
    WeightFetcher,
    remote_versions,
)


def state(version: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(version)
    return {
        "w": torch.randn(3, 4, generator=generator),
        "b": torch.full((4,), float(version)),
    }


def assert_same_tensors(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]):
    assert set(actual) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


@pytest.fixture
def remote(s3_uri: str) -> RemoteTree:
    return RemoteTree.open(s3_uri).child("weights")


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    base = tmp_path / "base-model"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "tiny"}')
    return base


@pytest.fixture
def store(tmp_path: Path, remote: RemoteTree) -> RemoteWeightStore:
    return RemoteWeightStore(tmp_path / "weights", remote)


def test_write_uploads_weights_config_and_marker(
    store: RemoteWeightStore, remote: RemoteTree, config_dir: Path
) -> None:
    """A version in the bucket is self-contained (weights and config, loadable by vLLM on its
    own) and marked complete, all before `write` returns and the learner announces it."""
    location = store.write(1, state(1), config_dir)

    assert Path(location) == store.root / "v000001"
    listing = remote.listing()
    assert set(listing) == {
        f"v000001/{WEIGHTS_FILE}",
        "v000001/config.json",
        f"v000001/{COMPLETE}",
    }
    assert listing[f"v000001/{WEIGHTS_FILE}"].size == (Path(location) / WEIGHTS_FILE).stat().st_size
    assert listing[f"v000001/{COMPLETE}"].size == 0
    assert remote_versions(remote) == [1]


def test_the_bucket_layout_is_under_the_trials_weights_prefix(
    store: RemoteWeightStore, s3_uri: str
) -> None:
    """The store writes under the tree it was given (`<trial>/weights`), nowhere else."""
    store.write(2, state(2))
    assert set(RemoteTree.open(s3_uri).listing()) == {
        f"weights/v000002/{WEIGHTS_FILE}",
        f"weights/v000002/{COMPLETE}",
    }


def test_remote_versions_lists_only_marked_versions(
    store: RemoteWeightStore, remote: RemoteTree
) -> None:
    """A version whose upload did not finish (no marker) must never be offered to a generator;
    nor is anything that is not a version directory."""
    store.write(1, state(1))
    store.write(3, state(3))
    remote.write_bytes(f"v000002/{WEIGHTS_FILE}", b"half an upload")
    remote.write_bytes(f"notaversion/{COMPLETE}", b"")
    remote.write_bytes(COMPLETE, b"")
    remote.write_bytes(f"v000004/nested/{COMPLETE}", b"")
    assert remote_versions(remote) == [1, 3]


def test_rewriting_a_version_replaces_it_in_the_bucket(
    store: RemoteWeightStore, remote: RemoteTree, tmp_path: Path
) -> None:
    """A learner resumed after a crash redoes a step and rewrites its version: generators that
    fetch afterwards get the new weights, still marked complete."""
    store.write(5, state(5))
    store.write(5, state(50))
    assert remote_versions(remote) == [5]
    fetched = WeightFetcher(tmp_path / "gen", remote).fetch(5)
    assert_same_tensors(read_state_dict(fetched), state(50))


def test_prune_deletes_in_the_bucket_too(store: RemoteWeightStore, remote: RemoteTree) -> None:
    """The bucket follows the same rule as the learner's disk: newest `keep` plus protected."""
    for version in range(5):
        store.write(version, state(version))
    removed = store.prune(keep=2, protect={0})
    assert removed == [1, 2]
    assert store.versions() == [0, 3, 4]
    assert remote_versions(remote) == [0, 3, 4]
    assert {rel.split("/")[0] for rel in remote.listing()} == {"v000000", "v000003", "v000004"}


def test_prune_after_resume_on_another_node_deletes_bucket_only_versions(
    tmp_path: Path, remote: RemoteTree
) -> None:
    """A learner resumed on a fresh node has only its new versions locally; the old ones exist
    only in the bucket and would otherwise stay there forever."""
    first = RemoteWeightStore(tmp_path / "node-a" / "weights", remote)
    for version in range(4):
        first.write(version, state(version))
    assert remote_versions(remote) == [0, 1, 2, 3]

    resumed = RemoteWeightStore(tmp_path / "node-b" / "weights", remote)
    resumed.write(4, state(4))
    resumed.prune(keep=2, protect={0})

    assert remote_versions(remote) == [0, 3, 4]
    assert {rel.split("/")[0] for rel in remote.listing()} == {"v000000", "v000003", "v000004"}
    assert resumed.versions() == [4]  # nothing is fetched back to the new node


def test_prune_leaves_no_orphan_files_of_a_version(
    store: RemoteWeightStore, remote: RemoteTree, config_dir: Path
) -> None:
    """A pruned version leaves no orphan files (config, weights) behind in the bucket."""
    store.write(1, state(1), config_dir)
    store.write(2, state(2), config_dir)
    store.prune(keep=1)
    assert not [rel for rel in remote.listing() if rel.startswith("v000001/")]
    assert remote_versions(remote) == [2]


def test_fetch_downloads_a_loadable_copy(
    store: RemoteWeightStore, remote: RemoteTree, config_dir: Path, tmp_path: Path
) -> None:
    """A generator resolves the announced version number to its own local copy, which loads to
    exactly the learner's tensors, config included, with no staging dir left behind."""
    store.write(7, state(7), config_dir)
    fetcher = WeightFetcher(tmp_path / "gen", remote)

    location = Path(fetcher.fetch(7))

    assert location == tmp_path / "gen" / "v000007"
    assert_same_tensors(read_state_dict(location), state(7))
    assert (location / "config.json").read_text() == '{"model_type": "tiny"}'
    assert not (location / COMPLETE).exists()
    assert sorted(p.name for p in (tmp_path / "gen").iterdir()) == ["v000007"]


def test_second_fetch_downloads_nothing(
    store: RemoteWeightStore, remote: RemoteTree, tmp_path: Path
) -> None:
    """A version is downloaded once per machine: a second fetch returns the local copy without
    touching the bucket (shown here by emptying the bucket in between)."""
    store.write(1, state(1))
    fetcher = WeightFetcher(tmp_path / "gen", remote)
    first = fetcher.fetch(1)
    mtime = (Path(first) / WEIGHTS_FILE).stat().st_mtime_ns

    remote.delete_tree("")
    assert remote.listing() == {}

    assert fetcher.fetch(1) == first
    assert (Path(first) / WEIGHTS_FILE).stat().st_mtime_ns == mtime
    assert WeightFetcher(tmp_path / "gen", remote).fetch(1) == first  # a restarted generator


def test_fetch_of_an_incomplete_version_names_keep_versions(
    store: RemoteWeightStore, remote: RemoteTree, tmp_path: Path
) -> None:
    """An announced version without its marker was pruned (or never finished): the error must
    say what to change, and nothing half-fetched may stay."""
    store.write(1, state(1))
    remote.write_bytes(f"v000002/{WEIGHTS_FILE}", b"partial")
    fetcher = WeightFetcher(tmp_path / "gen", remote)

    with pytest.raises(FileNotFoundError, match="keep_versions") as caught:
        fetcher.fetch(2)
    assert "version 2 " in str(caught.value)
    assert "test:test" not in str(caught.value)  # the bucket is named by its redacted label
    with pytest.raises(FileNotFoundError, match="keep_versions"):
        fetcher.fetch(9)  # never written at all
    assert list((tmp_path / "gen").iterdir()) == []


def test_fetch_of_a_pruned_version_fails(
    store: RemoteWeightStore, remote: RemoteTree, tmp_path: Path
) -> None:
    for version in range(3):
        store.write(version, state(version))
    store.prune(keep=1)
    with pytest.raises(FileNotFoundError, match="keep_versions"):
        WeightFetcher(tmp_path / "gen", remote).fetch(0)


def test_fetcher_keeps_only_the_newest_versions_locally(
    store: RemoteWeightStore, remote: RemoteTree, tmp_path: Path
) -> None:
    """Loaded weights live in the engine; old local copies only fill the generator's disk."""
    for version in range(1, 5):
        store.write(version, state(version))
    fetcher = WeightFetcher(tmp_path / "gen", remote, keep=2)
    for version in range(1, 5):
        fetcher.fetch(version)

    assert sorted(p.name for p in (tmp_path / "gen").iterdir()) == ["v000003", "v000004"]
    assert_same_tensors(read_state_dict(tmp_path / "gen" / "v000004"), state(4))


def test_fetcher_never_prunes_the_version_just_fetched(
    store: RemoteWeightStore, remote: RemoteTree, tmp_path: Path
) -> None:
    """A generator restarted on an older version (fixed staleness) must be able to load it,
    even though newer ones are present locally."""
    for version in (1, 3, 4):
        store.write(version, state(version))
    fetcher = WeightFetcher(tmp_path / "gen", remote, keep=2)
    fetcher.fetch(3)
    fetcher.fetch(4)
    location = fetcher.fetch(1)
    assert Path(location).is_dir()
    assert_same_tensors(read_state_dict(location), state(1))


def test_a_rewind_makes_the_fetcher_download_a_republished_version_again(
    store: RemoteWeightStore, remote: RemoteTree, tmp_path: Path
) -> None:
    """A bounded-mode rewind to v3 withdraws v4; the learner publishes other weights as v4.
    Without `forget_after` the fetcher would serve its copy of the withdrawn v4."""
    for version in (3, 4):
        store.write(version, state(version))
    fetcher = WeightFetcher(tmp_path / "gen", remote, keep=2)
    fetcher.fetch(3)
    fetcher.fetch(4)
    assert fetcher.forget_after(3) == [4]
    store.write(4, state(40))  # the new v4
    assert_same_tensors(read_state_dict(fetcher.fetch(4)), state(40))
    assert_same_tensors(read_state_dict(fetcher.fetch(3)), state(3))  # kept, not withdrawn
