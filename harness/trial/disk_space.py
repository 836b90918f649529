"""A full disk, told in one line: which directory, how much is left, what to do.

Every process of a trial writes under the trial directory (checkpoints, weights, metrics, logs,
the embedded Redis's AOF), and each fails differently when it fills: an OSError with ENOSPC, a
safetensors or torch writer error that only quotes the OS error's text, a Redis that refuses
writes or exits. `is_disk_full` recognises them all (the exception chain's errno or text, or a
write failure while almost nothing is left), so the learner and the supervisor can replace the
traceback with `disk_full_line`, and the trial ends `failed`, resumable once space is freed.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_FULL_TEXTS = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")
# Less than this left, a failed write (torch's "file write failed" names no errno) is the disk's.
LOW_SPACE_BYTES = 1 << 20


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem holding `path` (its nearest
    existing parent); None when that cannot be read."""
    for candidate in (path, *path.parents):
        try:
            stats = os.statvfs(candidate)
        except OSError:
            continue
        return stats.f_bavail * stats.f_frsize
    return None


def low_on_space(path: Path) -> bool:
    free = free_bytes(path)
    return free is not None and free < LOW_SPACE_BYTES


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_disk_full(exc: BaseException, directory: Path) -> bool:
    """Whether `exc` (or one it was raised from) is a write that failed for lack of space on
    the filesystem of `directory`: ENOSPC or EDQUOT, or their text quoted by a library, or a
    failed write naming no reason ("file write failed") while almost nothing is left."""
    messages = []
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno in _FULL_ERRNOS:
            return True
        messages.append(str(link).lower())
    if any(text in message for message in messages for text in _FULL_TEXTS):
        return True
    return any("writ" in message for message in messages) and low_on_space(directory)


def first_line(exc: BaseException) -> str:
    """`Type: message` of `exc` on one line."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def disk_full_line(directory: Path, what: str) -> str:
    """The one line a trial fails with when the disk under `directory` is full."""
    free = free_bytes(directory)
    left = "" if free is None else f", {free} bytes free"
    return (
        f"no space left on device under {directory}{left} ({what}); free space there and "
        "rerun the trial with --resume: it goes on from its last checkpoint"
    )


class DiskFullError(RuntimeError):
    """A write failed because the disk is full; the message is `disk_full_line`'s."""


@contextlib.contextmanager
def disk_full_as_one_line(
    directory: Path,
    *,
    error: type[Exception] = DiskFullError,
    keep: tuple[type[BaseException], ...] = (),
) -> Iterator[None]:
    """Re-raise a full disk met inside as `error` with `disk_full_line` (one line, no
    traceback); exceptions of a `keep` type (already one line) pass unchanged."""
    try:
        yield
    except keep:
        raise
    except Exception as exc:
        if not is_disk_full(exc, directory):
            raise
        raise error(disk_full_line(directory, first_line(exc))) from None
