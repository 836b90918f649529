"""An exclusive lock on a file, waited for with a deadline: one writer per cache entry or trial.

fcntl locks belong to the open file, so the kernel drops one when its holder dies (even by
SIGKILL): a crashed process never leaves a stale lock behind, unlike a pid file.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

POLL_S = 0.1


class LockTimeoutError(TimeoutError):
    """Another process held the lock past the deadline."""


@contextmanager
def file_lock(path: Path, timeout_s: float, held_by: str) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) for the `with` block; waits at most
    `timeout_s`, then raises LockTimeoutError saying who holds it (`held_by` completes "held
    by ...", e.g. "another process building this model")."""
    deadline = time.monotonic() + timeout_s
    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LockTimeoutError(
                        f"waited {timeout_s:.0f} s for the lock {path}, held by {held_by}"
                    ) from None
                time.sleep(POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
