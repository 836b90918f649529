"""The one atomic write, directory fsync and file digest (`contract.durable`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from contract import durable


def test_write_atomic_replaces_the_file_and_fsyncs_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a.json"
    target.write_bytes(b"old")
    synced: list[Path] = []
    real = durable.fsync_dir

    def spy(directory: Path) -> None:
        assert target.read_bytes() == b"new"  # the rename happened before the directory fsync
        synced.append(Path(directory))
        real(directory)

    monkeypatch.setattr(durable, "fsync_dir", spy)
    durable.write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and synced == [tmp_path]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]  # no temporary left


def test_a_writer_gets_the_temporary_path_and_a_failure_leaves_the_old_file(
    tmp_path: Path,
) -> None:
    target = tmp_path / "part.bin"
    durable.write_atomic(target, lambda tmp: tmp.write_bytes(b"v1"))
    assert target.read_bytes() == b"v1"

    def crash(tmp: Path) -> None:
        assert tmp == durable.temporary_path(target) and tmp.name == ".part.bin.tmp"
        tmp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        durable.write_atomic(target, crash)
    assert target.read_bytes() == b"v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part.bin"]


def test_file_digest_is_sha256_of_the_bytes_streamed(tmp_path: Path) -> None:
    big = tmp_path / "big"
    data = bytes(range(256)) * 9000  # over one 1 MiB chunk
    big.write_bytes(data)
    small = tmp_path / "small"
    small.write_bytes(b"tail")
    assert durable.file_digest(big) == hashlib.sha256(data).hexdigest()
    assert durable.file_digest(str(big)) == hashlib.sha256(data).hexdigest()
    both = durable.file_digest([big, small])  # several files: as if concatenated
    assert both == hashlib.sha256(data + b"tail").hexdigest()


def test_fsync_tree_syncs_every_file_and_directory_deepest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a/b").mkdir(parents=True)
    (tmp_path / "a/b/f").write_bytes(b"x")
    (tmp_path / "g").write_bytes(b"y")
    files: list[str] = []
    dirs: list[str] = []
    monkeypatch.setattr(durable, "fsync_file", lambda p: files.append(p.name))
    monkeypatch.setattr(durable, "fsync_dir", lambda p: dirs.append(Path(p).name))
    durable.fsync_tree(tmp_path)
    assert sorted(files) == ["f", "g"]
    assert dirs == ["b", "a", tmp_path.name]
