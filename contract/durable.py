"""Durable files: the one atomic write, the one fsync of a directory, the one file digest.

Why one module: a trial survives kills and power loss only if every file it later trusts was
written the same way, and a checkpoint vouches for files by their digest, so every writer and
every checker must agree on both. The atomic write is: a hidden temporary name in the same
directory (`.<name>.tmp`, which no listing of parts, ledgers or checkpoints returns), the
content written and flushed, the file fsynced, `os.replace` onto the final name (atomic on
POSIX: a reader sees the old file or the new one, never half of one), then the directory
fsynced so the rename itself survives a power loss. A write that fails removes its temporary
file. The digest is sha256 of the bytes, read in 1 MiB chunks so a 15 GB weight file never sits
in memory.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

_CHUNK = 1 << 20

Writer = Callable[[Path], None]
"""Writes the whole content to the path it is given (e.g. `pyarrow.parquet.write_table`)."""


def temporary_path(path: Path) -> Path:
    """Where `write_atomic` stages `path`: `.<name>.tmp` beside it (hidden, same filesystem)."""
    return path.with_name(f".{path.name}.tmp")


def write_atomic(path: Path, content: bytes | Writer) -> None:
    """Replace `path` by `content` (bytes, or a writer given the temporary path) atomically and
    durably: temporary file, flush, fsync, `os.replace`, fsync of the directory."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        if isinstance(content, bytes):
            with tmp.open("wb") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
        else:
            content(tmp)
            fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write or replace leaves no temporary behind
        raise
    fsync_dir(path.parent)


def fsync_file(path: Path) -> None:
    """Flush a file's data (written and closed by someone else) to the disk."""
    with Path(path).open("rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(directory: Path) -> None:
    """Make the entries of `directory` (a rename into it, a file created in it) durable."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(root: Path) -> None:
    """fsync every file under `root`, then every directory, deepest first, `root` last: a
    directory written in full before it is renamed into place (a checkpoint)."""
    root = Path(root)
    for child in root.rglob("*"):
        if child.is_file():
            fsync_file(child)
    for directory in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(directory)
    fsync_dir(root)


def file_digest(paths: str | os.PathLike[str] | Iterable[Path]) -> str:
    """sha256 (hex) of a file's bytes, streamed; of several files, of their bytes in the order
    given, as if concatenated (a plugin package's sources)."""
    digest = hashlib.sha256()
    for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        with Path(path).open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()
