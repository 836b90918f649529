"""A directory tree under a pyarrow.fs URI: list, upload, download, delete. Nothing else.

Why pyarrow.fs: it is already a dependency (Parquet), speaks S3, GCS, HDFS and local paths
through one interface, and takes endpoint and credentials from the URI's query or the usual
environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...), so nothing here is S3-specific.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit, urlunsplit

import pyarrow.fs as pafs

from harness.storage.output import is_uri, redact

__all__ = [
    "CHUNK_BYTES",
    "RemoteFile",
    "RemoteTree",
    "StorageError",
    "is_uri",
    "join_uri",
    "redact",
]

CHUNK_BYTES: Final = 8 << 20
_LOCAL: Final = pafs.LocalFileSystem()


class StorageError(RuntimeError):
    """The bucket (or other remote tree) cannot be opened, read or written; names it."""


@dataclass(frozen=True)
class RemoteFile:
    size: int
    mtime_ns: int


def join_uri(uri: str, *parts: str) -> str:
    """`uri` with path parts appended, its query (endpoint, region, ...) kept at the end."""
    split = urlsplit(uri)
    path = "/".join([split.path.rstrip("/"), *(p.strip("/") for p in parts if p)])
    return urlunsplit(split._replace(path=path))


class RemoteTree:
    """Files under `base` on `fs`, addressed by '/'-separated paths relative to `base`."""

    def __init__(self, fs: pafs.FileSystem, base: str, label: str) -> None:
        self.fs = fs
        self.base = base.rstrip("/")
        self.label = label  # for messages: the redacted URI

    @classmethod
    def open(cls, uri: str) -> RemoteTree:
        """The tree at `uri`; a bad scheme or unreachable store fails here, naming the URI."""
        try:
            fs, base = pafs.FileSystem.from_uri(uri)
        except (OSError, ValueError) as exc:
            reason = str(exc).replace(uri, redact(uri))  # pyarrow echoes the credentials
            raise StorageError(f"cannot open storage {redact(uri)}: {reason}") from None
        return cls(fs, base, redact(uri))

    def child(self, rel: str) -> RemoteTree:
        return RemoteTree(self.fs, self._path(rel), f"{self.label.rstrip('/')}/{rel.strip('/')}")

    def listing(self, prefix: str = "") -> dict[str, RemoteFile]:
        """Every file at or under `prefix` (a file or a directory), by relative path."""
        path = self._path(prefix)
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            return {prefix.strip("/"): RemoteFile(info.size, info.mtime_ns or 0)}
        if info.type != pafs.FileType.Directory:
            return {}
        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        found = {}
        for entry in self.fs.get_file_info(selector):
            if entry.type == pafs.FileType.File:
                rel = entry.path[len(self.base) :].lstrip("/")
                found[rel] = RemoteFile(entry.size, entry.mtime_ns or 0)
        return found

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(self._path(rel)).type == pafs.FileType.File

    def upload(self, local: Path, rel: str) -> None:
        """Copy one local file to `rel` (an object store makes it visible whole, or not)."""
        target = self._path(rel)
        self._make_parent(target)
        if not local.is_file():
            raise FileNotFoundError(local)
        # pyarrow's copy runs in C++ with background writes (S3: parallel multipart parts);
        # a Python read/write loop was 0.6x its speed on a 129 MB trial (storage_bench.py)
        pafs.copy_files(
            str(local), target, source_filesystem=_LOCAL, destination_filesystem=self.fs,
            chunk_size=CHUNK_BYTES,
        )  # fmt: skip

    def write_bytes(self, rel: str, data: bytes) -> None:
        target = self._path(rel)
        self._make_parent(target)
        with self.fs.open_output_stream(target) as sink:
            sink.write(data)

    def download(self, rel: str, local: Path, mtime_ns: int | None = None) -> None:
        """Copy `rel` to `local` atomically (temporary name, then rename); its mtime is set to
        `mtime_ns`, the remote one, so a later comparison of (size, mtime) sees them in sync."""
        local.parent.mkdir(parents=True, exist_ok=True)
        staging = local.with_name(f".{local.name}.{uuid.uuid4().hex[:8]}.part")
        try:
            pafs.copy_files(
                self._path(rel), str(staging), source_filesystem=self.fs,
                destination_filesystem=_LOCAL, chunk_size=CHUNK_BYTES,
            )  # fmt: skip
            if mtime_ns is not None:
                os.utime(staging, ns=(mtime_ns, mtime_ns))
            staging.replace(local)
        finally:
            staging.unlink(missing_ok=True)

    def delete(self, rel: str) -> None:
        """Delete one file; an absent one is not an error (two deleters may race)."""
        try:
            self.fs.delete_file(self._path(rel))
        except FileNotFoundError:
            return

    def delete_tree(self, prefix: str) -> None:
        """Delete a file, or a directory and all under it (S3: batched DeleteObjects requests,
        not one request per file); an absent prefix is not an error."""
        path = self._path(prefix)
        kind = self.fs.get_file_info(path).type
        try:
            if kind == pafs.FileType.File:
                self.fs.delete_file(path)
            elif kind == pafs.FileType.Directory:
                self.fs.delete_dir(path)
        except FileNotFoundError:  # a concurrent deleter got there first
            return

    def _path(self, rel: str) -> str:
        rel = rel.strip("/")
        return f"{self.base}/{rel}" if rel else self.base

    def _make_parent(self, target: str) -> None:
        # Object stores have no directories; a local or HDFS tree needs them created.
        if self.fs.type_name not in ("s3", "gcs"):
            self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
