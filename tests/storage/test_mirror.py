"""Mirror: a local working copy kept in step with a bucket, one direction at a time.

Every trial process writes POSIX files locally and relies on the mirror to publish exactly what
changed (and nothing half-written or private), in an order that never exposes a pointer before
its data, and to recognise after a restart what is already in step.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.storage.mirror import Mirror
from harness.storage.remote_tree import RemoteTree

NS = 1_000_000_000


def read_remote(tree: RemoteTree, rel: str) -> bytes:
    with tree.fs.open_input_stream(f"{tree.base}/{rel}") as stream:
        return stream.readall()


def write(root: Path, rel: str, data: str | bytes, mtime_s: int | None = None) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    if mtime_s is not None:
        os.utime(path, ns=(mtime_s * NS, mtime_s * NS))
    return path


def local_files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def tree(s3_uri: str) -> RemoteTree:
    return RemoteTree.open(s3_uri)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    root.mkdir()
    return root


# ---- push ---------------------------------------------------------------------------------------


def test_push_uploads_new_files_and_returns_them(tree: RemoteTree, work: Path) -> None:
    """The first push publishes the whole working copy under the prefixes, byte for byte."""
    write(work, "trial.json", '{"a": 1}')
    write(work, "metrics.parquet/part-000001.parquet", b"\x00parquet")
    write(work, "checkpoints/step-1/model.pt", b"tensor bytes")

    uploaded = Mirror(work, tree).push([""])

    expected = {"trial.json", "metrics.parquet/part-000001.parquet", "checkpoints/step-1/model.pt"}
    assert set(uploaded) == expected
    assert len(uploaded) == len(expected)
    assert set(tree.listing()) == expected
    for rel in expected:
        assert read_remote(tree, rel) == (work / rel).read_bytes()


def test_second_push_uploads_nothing(tree: RemoteTree, work: Path) -> None:
    """Periodic pushes (every few seconds) must cost a listing, not a re-upload of everything."""
    write(work, "a.txt", "a")
    write(work, "d/b.txt", "b")
    mirror = Mirror(work, tree)
    assert len(mirror.push([""])) == 2
    before = tree.listing()
    assert mirror.push([""]) == []
    assert tree.listing() == before


def test_a_modified_file_is_reuploaded_alone(tree: RemoteTree, work: Path) -> None:
    """A change of content (size) or of mtime alone both count as changed; others stay put."""
    write(work, "a.txt", "a", mtime_s=1_700_000_000)
    write(work, "b.txt", "b", mtime_s=1_700_000_000)
    write(work, "c.txt", "c", mtime_s=1_700_000_000)
    mirror = Mirror(work, tree)
    mirror.push([""])

    write(work, "b.txt", "bigger b", mtime_s=1_700_000_000)  # new size, same mtime
    assert mirror.push([""]) == ["b.txt"]
    assert read_remote(tree, "b.txt") == b"bigger b"

    write(work, "c.txt", "C", mtime_s=1_700_000_100)  # same size, new mtime
    assert mirror.push([""]) == ["c.txt"]
    assert read_remote(tree, "c.txt") == b"C"
    assert read_remote(tree, "a.txt") == b"a"


def test_hidden_names_are_never_uploaded(tree: RemoteTree, work: Path) -> None:
    """Staging dirs, locks and partial downloads are private to one process: a reader of the
    bucket must never see (or pull) them."""
    write(work, ".tmp-x/model.safetensors", "half written")
    write(work, ".lock", "")
    write(work, "dir/.part", "partial")
    write(work, "dir/.supervisor.lock", "")
    write(work, "dir/real.txt", "real")

    uploaded = Mirror(work, tree).push([""])

    assert uploaded == ["dir/real.txt"]
    assert set(tree.listing()) == {"dir/real.txt"}
    # a prefix that names a hidden file directly is not pushed either
    assert Mirror(work, tree).push([".lock", "dir/.part"]) == []
    assert set(tree.listing()) == {"dir/real.txt"}


def test_a_sharded_checkpoint_index_is_synced_both_ways(tree: RemoteTree, work: Path) -> None:
    """torch.distributed.checkpoint names its index `.metadata`: data, not a temporary, so it
    travels with the shards (a checkpoint in flight, `.tmp-step-*`, still does not)."""
    write(work, "checkpoints/step-000002/shards/.metadata", "index", mtime_s=1_700_000_000)
    write(work, "checkpoints/step-000002/shards/__0_0.distcp", "s0", mtime_s=1_700_000_001)
    write(work, "checkpoints/.tmp-step-000004/shards/.metadata", "half", mtime_s=1_700_000_002)

    uploaded = Mirror(work, tree).push(["checkpoints"])

    assert uploaded == [
        "checkpoints/step-000002/shards/.metadata",
        "checkpoints/step-000002/shards/__0_0.distcp",
    ]
    elsewhere = work.parent / "elsewhere"
    pulled = Mirror(elsewhere, tree).pull(["checkpoints"])
    assert sorted(pulled) == uploaded
    assert (elsewhere / "checkpoints/step-000002/shards/.metadata").read_text() == "index"


def test_a_prefix_naming_a_hidden_directory_uploads_nothing(tree: RemoteTree, work: Path) -> None:
    """`publish_working_copy` pushes every top-level entry of the driver's copy by name; a
    staging dir there (`.tmp-*`) must stay private like any other hidden name."""
    write(work, ".tmp-x/model.safetensors", "half written")
    assert Mirror(work, tree).push([".tmp-x"]) == []
    assert tree.listing() == {}


def test_push_delete_propagates_a_removed_file(tree: RemoteTree, work: Path) -> None:
    """A pruned checkpoint must disappear from the bucket too (delete=True), but a publisher
    that does not own every file under a prefix (delete=False) must leave the rest alone."""
    write(work, "checkpoints/step-1.pt", "1")
    write(work, "checkpoints/step-2.pt", "2")
    mirror = Mirror(work, tree)
    mirror.push(["checkpoints"])

    (work / "checkpoints/step-1.pt").unlink()
    assert mirror.push(["checkpoints"], delete=False) == []
    assert set(tree.listing()) == {"checkpoints/step-1.pt", "checkpoints/step-2.pt"}

    assert mirror.push(["checkpoints"], delete=True) == []
    assert set(tree.listing()) == {"checkpoints/step-2.pt"}


def test_push_delete_stays_within_its_prefixes(tree: RemoteTree, work: Path) -> None:
    """Files others own (outside the pushed prefixes) are never deleted by this side's push."""
    tree.write_bytes("logs/generator-0.log", b"someone else's")
    write(work, "checkpoints/latest.json", "{}")
    Mirror(work, tree).push(["checkpoints"], delete=True)
    assert set(tree.listing()) == {"logs/generator-0.log", "checkpoints/latest.json"}


def test_push_order_is_oldest_mtime_first(tree: RemoteTree, work: Path) -> None:
    """Writers finish data before the pointer to it; uploading oldest first means a reader of
    the bucket never finds `latest.json` naming a checkpoint that is not there yet."""
    write(work, "checkpoints/latest.json", "{}", mtime_s=1_700_000_300)
    write(work, "checkpoints/step-2/model.pt", "m", mtime_s=1_700_000_200)
    write(work, "checkpoints/step-2/optim.pt", "o", mtime_s=1_700_000_100)
    write(work, "checkpoints/a-newest.txt", "z", mtime_s=1_700_000_400)

    uploaded = Mirror(work, tree).push(["checkpoints"])

    assert uploaded == [
        "checkpoints/step-2/optim.pt",
        "checkpoints/step-2/model.pt",
        "checkpoints/latest.json",
        "checkpoints/a-newest.txt",
    ]


def test_a_new_mirror_over_a_pulled_copy_uploads_nothing(
    tree: RemoteTree, work: Path, tmp_path: Path
) -> None:
    """A restarted component starts with a fresh Mirror (no memory) over files it had pulled:
    they carry the remote mtime, so one listing shows them in step and nothing is re-uploaded."""
    write(work, "trial.json", "{}")
    write(work, "prompts.parquet", b"prompts")
    write(work, "sub/dir/file.bin", b"\x01\x02")
    Mirror(work, tree).push([""])
    before = tree.listing()

    copy = tmp_path / "component"
    assert len(Mirror(copy, tree).pull([""])) == 3

    restarted = Mirror(copy, tree)  # a new process over the same directory
    assert restarted.push([""]) == []
    assert tree.listing() == before


def test_push_of_a_single_file_prefix(tree: RemoteTree, work: Path) -> None:
    """Supervisor files are pushed by name (trial.json), leaving siblings alone; a named file
    that is gone locally is deleted remotely."""
    write(work, "trial.json", "{}")
    write(work, "other.txt", "not mine")
    mirror = Mirror(work, tree)

    assert mirror.push(["trial.json"]) == ["trial.json"]
    assert set(tree.listing()) == {"trial.json"}
    assert mirror.push(["trial.json"]) == []

    (work / "trial.json").unlink()
    mirror.push(["trial.json"], delete=True)
    assert tree.listing() == {}


def test_push_of_a_missing_prefix_is_a_no_op(tree: RemoteTree, work: Path) -> None:
    """Pushing learner prefixes before the learner wrote any of them is normal, not an error."""
    tree.write_bytes("unrelated.txt", b"x")
    assert Mirror(work, tree).push(["metrics.parquet", "learner_outcome.json"]) == []
    assert set(tree.listing()) == {"unrelated.txt"}


# ---- pull ---------------------------------------------------------------------------------------


@pytest.fixture
def published(tree: RemoteTree) -> RemoteTree:
    """What other processes put in the bucket."""
    tree.write_bytes("trial.json", b'{"name": "t"}')
    tree.write_bytes("metrics.parquet/part-000001.parquet", b"m1")
    tree.write_bytes("metrics.parquet/part-000002.parquet", b"m22")
    tree.write_bytes("logs/learner.log", b"log")
    return tree


def test_pull_into_an_empty_dir(published: RemoteTree, work: Path) -> None:
    """A component on a new node starts from the bucket: every file arrives, with remote mtimes."""
    downloaded = Mirror(work, published).pull([""])
    listing = published.listing()
    assert sorted(downloaded) == sorted(listing)
    assert local_files(work) == set(listing)
    for rel, info in listing.items():
        assert (work / rel).read_bytes() == read_remote(published, rel)
        assert (work / rel).stat().st_mtime_ns == info.mtime_ns


def test_second_pull_downloads_nothing(published: RemoteTree, work: Path) -> None:
    """The supervisor pulls progress every few seconds; unchanged files are not fetched again,
    not by the same mirror and not by a fresh one (a restarted supervisor)."""
    mirror = Mirror(work, published)
    mirror.pull([""])
    assert mirror.pull([""]) == []
    assert Mirror(work, published).pull([""]) == []


def test_pull_fetches_a_file_changed_remotely(published: RemoteTree, work: Path) -> None:
    mirror = Mirror(work, published)
    mirror.pull(["metrics.parquet"])
    published.write_bytes("metrics.parquet/part-000002.parquet", b"rewritten, longer")
    published.write_bytes("metrics.parquet/part-000003.parquet", b"m3")
    assert sorted(mirror.pull(["metrics.parquet"])) == [
        "metrics.parquet/part-000002.parquet",
        "metrics.parquet/part-000003.parquet",
    ]
    assert (work / "metrics.parquet/part-000002.parquet").read_bytes() == b"rewritten, longer"


def test_pull_delete_removes_files_the_remote_no_longer_has(
    published: RemoteTree, work: Path
) -> None:
    """A truncated metrics part (learner resumed from an older checkpoint) must vanish locally,
    or the supervisor would count steps that no longer exist; delete=False keeps it."""
    mirror = Mirror(work, published)
    mirror.pull([""])
    published.delete("metrics.parquet/part-000002.parquet")

    assert mirror.pull(["metrics.parquet"], delete=False) == []
    assert (work / "metrics.parquet/part-000002.parquet").exists()

    assert mirror.pull(["metrics.parquet"], delete=True) == []
    assert not (work / "metrics.parquet/part-000002.parquet").exists()
    assert (work / "metrics.parquet/part-000001.parquet").exists()
    assert (work / "trial.json").exists()  # outside the pulled prefix


def test_pull_without_overwrite_keeps_a_local_change(published: RemoteTree, work: Path) -> None:
    """Restoring a driver's working copy must not clobber what the driver has newer locally;
    a plain pull, by contrast, makes the local copy equal to the remote."""
    mirror = Mirror(work, published)
    mirror.pull([""])
    write(work, "trial.json", '{"name": "t", "local": "edit"}')

    assert Mirror(work, published).pull([""], overwrite=False) == []
    assert (work / "trial.json").read_text() == '{"name": "t", "local": "edit"}'

    assert Mirror(work, published).pull([""]) == ["trial.json"]
    assert (work / "trial.json").read_bytes() == b'{"name": "t"}'


def test_pull_without_overwrite_still_fetches_missing_files(
    published: RemoteTree, work: Path
) -> None:
    write(work, "trial.json", "local")
    downloaded = Mirror(work, published).pull([""], delete=False, overwrite=False)
    assert "trial.json" not in downloaded
    assert "logs/learner.log" in downloaded
    assert (work / "trial.json").read_text() == "local"


def test_pull_skips_weights_dirs_at_any_depth(tree: RemoteTree, work: Path) -> None:
    """With private components the driver never needs weights (the learner keeps its own);
    skipping them saves downloading gigabytes, wherever the `weights` dir sits."""
    tree.write_bytes("weights/v000001/model.safetensors", b"w")
    tree.write_bytes("trials/t1/weights/v000002/model.safetensors", b"w")
    tree.write_bytes("trials/t1/checkpoints/latest.json", b"{}")
    tree.write_bytes("trials/t1/trial.json", b"{}")
    tree.write_bytes("trials/t1/weights_report.txt", b"a file, not the dir")

    downloaded = Mirror(work, tree).pull([""], delete=False, skip_dirs=("weights",))

    assert sorted(downloaded) == [
        "trials/t1/checkpoints/latest.json",
        "trials/t1/trial.json",
        "trials/t1/weights_report.txt",
    ]
    assert local_files(work) == set(downloaded)


def test_pull_delete_leaves_skipped_dirs_alone(tree: RemoteTree, work: Path) -> None:
    """`skip_dirs` says "never anything inside": a learner's local weights that the bucket does
    not have (yet) must survive a pull with delete=True that skips them."""
    tree.write_bytes("trial.json", b"{}")
    write(work, "weights/v000003/model.safetensors", "local only")
    Mirror(work, tree).pull([""], delete=True, skip_dirs=("weights",))
    assert (work / "weights/v000003/model.safetensors").exists()


def test_pull_never_fetches_hidden_remote_names(tree: RemoteTree, work: Path) -> None:
    """Should anything hidden reach the bucket, it is not pulled into a working copy either."""
    tree.write_bytes(".supervisor.lock", b"")
    tree.write_bytes("dir/.x.part", b"partial")
    tree.write_bytes("dir/ok.txt", b"ok")
    assert Mirror(work, tree).pull([""]) == ["dir/ok.txt"]
    assert local_files(work) == {"dir/ok.txt"}


def test_pull_of_a_single_file_prefix(published: RemoteTree, work: Path) -> None:
    """learner_outcome.json and trial.json are pulled by name, without their siblings; once
    the remote file is gone, pull(delete=True) removes the local one."""
    mirror = Mirror(work, published)
    assert mirror.pull(["trial.json"]) == ["trial.json"]
    assert local_files(work) == {"trial.json"}
    assert mirror.pull(["trial.json"]) == []

    published.delete("trial.json")
    assert mirror.pull(["trial.json"], delete=True) == []
    assert not (work / "trial.json").exists()


def test_pull_of_a_missing_prefix_downloads_nothing(published: RemoteTree, work: Path) -> None:
    assert Mirror(work, published).pull(["evals.parquet", "learner_outcome.json"]) == []
    assert local_files(work) == set()
