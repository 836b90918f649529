"""RemoteTree on a real S3 endpoint (moto) and on a local file:// tree, plus the URI helpers.

Everything the mirror and the weight store do goes through these few calls, so their contract
(relative keys, atomic downloads with the remote mtime, idempotent deletes, no credentials in
messages) is what the rest of the storage layer stands on.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.storage.remote_tree import (
    RemoteFile,
    RemoteTree,
    StorageError,
    is_uri,
    join_uri,
    redact,
)


def read_remote(tree: RemoteTree, rel: str) -> bytes:
    with tree.fs.open_input_stream(f"{tree.base}/{rel}") as stream:
        return stream.readall()


def leftovers(directory: Path) -> list[str]:
    """Hidden or partial files a download may have left behind."""
    return sorted(
        p.name for p in directory.rglob("*") if p.name.startswith(".") or p.suffix == ".part"
    )


@pytest.fixture
def tree(s3_uri: str) -> RemoteTree:
    return RemoteTree.open(s3_uri)


@pytest.fixture
def nested(tree: RemoteTree) -> RemoteTree:
    """A few files under nested prefixes, with a sibling sharing a name prefix (`a` / `ab`)."""
    tree.write_bytes("a/b/c.txt", b"ccc")
    tree.write_bytes("a/b/d.txt", b"dddd")
    tree.write_bytes("a/e.txt", b"e")
    tree.write_bytes("ab/x.txt", b"xx")
    tree.write_bytes("f.txt", b"ffffff")
    return tree


def test_listing_of_the_whole_tree_gives_relative_keys_and_sizes(nested: RemoteTree) -> None:
    """Keys are relative to the tree's base (never the bucket name), so a mirror can map them
    straight onto its local root."""
    listing = nested.listing()
    assert {rel: f.size for rel, f in listing.items()} == {
        "a/b/c.txt": 3,
        "a/b/d.txt": 4,
        "a/e.txt": 1,
        "ab/x.txt": 2,
        "f.txt": 6,
    }
    assert all(isinstance(f, RemoteFile) and f.mtime_ns > 0 for f in listing.values())


def test_listing_of_a_directory_prefix_is_recursive_and_exact(nested: RemoteTree) -> None:
    """A prefix is a directory, not a string prefix: `a` must not pick up `ab/x.txt`."""
    assert set(nested.listing("a")) == {"a/b/c.txt", "a/b/d.txt", "a/e.txt"}
    assert set(nested.listing("a/b/")) == {"a/b/c.txt", "a/b/d.txt"}


def test_listing_of_a_file_prefix_names_that_file(nested: RemoteTree) -> None:
    """Single-file prefixes (trial.json, learner_outcome.json) are synced the same way as dirs."""
    assert nested.listing("a/b/c.txt") == {"a/b/c.txt": nested.listing()["a/b/c.txt"]}
    assert nested.listing("/f.txt") == {"f.txt": nested.listing()["f.txt"]}


def test_listing_of_a_missing_prefix_is_empty(nested: RemoteTree) -> None:
    """Nothing uploaded yet (a fresh trial) is an empty listing, not an error."""
    assert nested.listing("missing") == {}
    assert nested.listing("a/b/c") == {}  # a name prefix of a file is not that file


def test_listing_of_an_empty_bucket_prefix_is_empty(tree: RemoteTree) -> None:
    assert tree.listing() == {}


def test_upload_download_round_trip_keeps_bytes_and_remote_mtime(
    tree: RemoteTree, tmp_path: Path
) -> None:
    """The downloaded copy carries the remote mtime: that is how a restarted process recognises
    files already in step from one listing, without a manifest."""
    source = tmp_path / "src" / "blob.bin"
    source.parent.mkdir()
    data = os.urandom(200_000)
    source.write_bytes(data)
    tree.upload(source, "deep/dir/blob.bin")

    info = tree.listing()["deep/dir/blob.bin"]
    assert info.size == len(data)
    target = tmp_path / "dst" / "sub" / "blob.bin"  # parents are created
    tree.download("deep/dir/blob.bin", target, info.mtime_ns)
    assert target.read_bytes() == data
    assert target.stat().st_mtime_ns == info.mtime_ns
    assert leftovers(tmp_path / "dst") == []


def test_download_replaces_an_existing_file(tree: RemoteTree, tmp_path: Path) -> None:
    """A newer remote version replaces the local file whole (rename, no in-place rewrite)."""
    tree.write_bytes("x.json", b'{"v": 2}')
    target = tmp_path / "x.json"
    target.write_bytes(b'{"v": 1, "older and longer": true}')
    tree.download("x.json", target)
    assert target.read_bytes() == b'{"v": 2}'
    assert leftovers(tmp_path) == []


def test_failed_download_leaves_nothing_behind(tree: RemoteTree, tmp_path: Path) -> None:
    """A download that fails leaves neither the target nor a partial file a reader could see."""
    target = tmp_path / "out" / "missing.bin"
    with pytest.raises(OSError):
        tree.download("missing.bin", target)
    assert not target.exists()
    assert leftovers(tmp_path / "out") == []


def test_write_bytes_and_exists(tree: RemoteTree) -> None:
    """`exists` is about files: a directory prefix is not a file (markers are files)."""
    tree.write_bytes("v000001/_COMPLETE", b"")
    tree.write_bytes("notes/readme.txt", b"hello")
    assert tree.exists("v000001/_COMPLETE")
    assert tree.listing()["v000001/_COMPLETE"].size == 0
    assert read_remote(tree, "notes/readme.txt") == b"hello"
    assert not tree.exists("notes")
    assert not tree.exists("nothing/here")


def test_write_bytes_overwrites(tree: RemoteTree) -> None:
    tree.write_bytes("k", b"first")
    tree.write_bytes("k", b"2nd")
    assert read_remote(tree, "k") == b"2nd"
    assert tree.listing()["k"].size == 3


def test_delete_of_a_missing_file_is_not_an_error(tree: RemoteTree) -> None:
    """Two deleters (a pruning learner and a retried one) may race; the loser must not fail."""
    tree.write_bytes("gone.txt", b"1")
    tree.delete("gone.txt")
    assert not tree.exists("gone.txt")
    tree.delete("gone.txt")
    tree.delete("never/existed.txt")
    assert tree.listing() == {}


def test_delete_tree_removes_only_that_directory(nested: RemoteTree) -> None:
    """Forgetting `a` (a fresh trial's leftovers) must not touch `ab` or anything else."""
    nested.delete_tree("a")
    assert set(nested.listing()) == {"ab/x.txt", "f.txt"}
    nested.delete_tree("a")  # again: nothing left, no error
    nested.delete_tree("f.txt")  # a file prefix
    assert set(nested.listing()) == {"ab/x.txt"}


def test_child_is_rooted_under_the_parent(tree: RemoteTree, s3_uri: str) -> None:
    """`child("weights")` is how weight versions get their own tree: its keys are relative to
    the child, and they land under the parent's prefix."""
    weights = tree.child("weights")
    weights.write_bytes("v000001/model.safetensors", b"w")
    assert set(weights.listing()) == {"v000001/model.safetensors"}
    assert set(tree.listing()) == {"weights/v000001/model.safetensors"}
    assert weights.exists("v000001/model.safetensors")
    assert weights.label == redact(s3_uri) + "/weights"
    assert "test:test" not in weights.label


def test_child_of_child_and_delete_through_it(tree: RemoteTree) -> None:
    grandchild = tree.child("trials/").child("/t1")
    grandchild.write_bytes("trial.json", b"{}")
    assert tree.exists("trials/t1/trial.json")
    grandchild.delete_tree("")
    assert tree.listing() == {}


def test_local_file_uri_round_trip(tmp_path: Path) -> None:
    """The same calls on a file:// tree (pyarrow LocalFileSystem): nothing here is S3-specific,
    and a local tree gets the parent directories an object store does not need."""
    remote_root = tmp_path / "remote"
    tree = RemoteTree.open(remote_root.as_uri())
    assert tree.listing() == {}

    source = tmp_path / "source.bin"
    source.write_bytes(b"local bytes")
    tree.upload(source, "a/b/source.bin")
    tree.write_bytes("a/marker", b"")
    assert (remote_root / "a" / "b" / "source.bin").read_bytes() == b"local bytes"

    listing = tree.listing("a")
    assert set(listing) == {"a/b/source.bin", "a/marker"}
    info = listing["a/b/source.bin"]
    assert info.size == len(b"local bytes")

    target = tmp_path / "copy" / "source.bin"
    tree.download("a/b/source.bin", target, info.mtime_ns)
    assert target.read_bytes() == b"local bytes"
    assert target.stat().st_mtime_ns == info.mtime_ns
    assert leftovers(tmp_path / "copy") == []

    assert tree.exists("a/marker") and not tree.exists("a/b")
    tree.delete("a/marker")
    tree.delete("a/marker")
    tree.delete_tree("a")
    assert tree.listing() == {}


def test_join_uri_keeps_the_query_at_the_end() -> None:
    """Endpoint and region live in the query; appending path parts after it would lose them."""
    assert join_uri("s3://b/p?x=1", "trials", "t") == "s3://b/p/trials/t?x=1"
    assert join_uri("s3://b/p/?x=1&y=2", "/trials/", "t/") == "s3://b/p/trials/t?x=1&y=2"
    assert join_uri("s3://k:s@b/p", "a", "", "c") == "s3://k:s@b/p/a/c"
    assert join_uri("file:///tmp/x", "a") == "file:///tmp/x/a"


def test_join_uri_result_opens_the_subtree(tree: RemoteTree, s3_uri: str) -> None:
    """A joined URI is usable as is: it reaches the same files as `child`."""
    tree.write_bytes("trials/t/trial.json", b"{}")
    assert set(RemoteTree.open(join_uri(s3_uri, "trials", "t")).listing()) == {"trial.json"}


@pytest.mark.parametrize("value", ["s3://b/x", "file:///tmp/x", "gs://bucket/p?x=1"])
def test_is_uri_accepts_scheme_uris(value: str) -> None:
    assert is_uri(value)


@pytest.mark.parametrize("value", ["/abs/path", "relative/path", "C:\\x", "C:/x", "s3:/b/x", ""])
def test_is_uri_rejects_paths(value: str) -> None:
    """An output_dir that is a path (even one with a drive letter) stays a local directory."""
    assert not is_uri(value)


def test_redact_drops_credentials_and_query(s3_uri: str) -> None:
    """Labels and messages carry the redacted form: the bucket name, never the secret."""
    assert redact("s3://user:password@bucket/a/b?secret_key=x&region=y") == "s3://bucket/a/b"
    assert redact("hdfs://user:password@namenode:8020/runs") == "hdfs://namenode:8020/runs"
    redacted = redact(s3_uri)
    assert redacted.startswith("s3://t-") and redacted.endswith("/exp")
    assert "test:test" not in redacted and "?" not in redacted and "@" not in redacted
    assert RemoteTree.open(s3_uri).label == redacted


def test_open_with_an_unknown_scheme_names_the_uri_without_the_secret() -> None:
    """pyarrow echoes the whole URI in its error; ours must not leak the password."""
    with pytest.raises(StorageError) as caught:
        RemoteTree.open("nosuch://u:secret@b/x")
    message = str(caught.value)
    assert "secret" not in message
    assert "nosuch://b/x" in message


def test_open_with_a_bad_query_is_a_storage_error_without_the_secret() -> None:
    with pytest.raises(StorageError) as caught:
        RemoteTree.open("s3://u:secret@b/x?no_such_option=1")
    assert "secret" not in str(caught.value)
    assert "s3://b/x" in str(caught.value)
