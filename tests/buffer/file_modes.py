"""Permission checks shared by the tests of private files (Redis data, component logs)."""

from __future__ import annotations

import stat
from pathlib import Path


def modes_below(root: Path) -> dict[str, int]:
    """Permission bits of `root` and of everything under it, by relative path ('.' is root)."""
    paths = [root, *sorted(root.rglob("*"))]
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in paths}


def assert_private(root: Path) -> None:
    """`root` and every directory below it are 0700, every file 0600."""
    modes = modes_below(root)
    for name, mode in modes.items():
        want = 0o700 if (root / name).is_dir() else 0o600
        assert mode == want, f"{name}: {oct(mode)}, want {oct(want)} (all: {modes})"
