"""Keep a local working copy of a directory in step with a RemoteTree, one direction at a time.

The caller says which paths it owns: `push` makes the remote equal to the local copy under
those paths, `pull` the local copy equal to the remote under the paths others write. The rule
for "unchanged" is (size, mtime) equal to what this mirror last synced; a file fetched from the
remote gets the remote's mtime, so a fresh process (a restarted component) recognises what is
already in step from one listing, without a manifest.

Push order is oldest modification first: writers in this project finish their data before the
file that points at it (a checkpoint's tensors before `latest.json`, a step's metrics before its
checkpoint), so a reader of the remote never sees a pointer to something not yet uploaded.
Hidden names (`.tmp-*`, `.supervisor.lock`, partial downloads) are never synced, but for
`.metadata`: torch.distributed.checkpoint's index of a sharded checkpoint (`step-N/shards/`),
which that library names so and without which the shards cannot be loaded.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from harness.storage.remote_tree import RemoteFile, RemoteTree

Stat = tuple[int, int]  # (size, mtime_ns)


SYNCED_DOTFILES = frozenset({".metadata"})


def _hidden_name(name: str) -> bool:
    return name.startswith(".") and name not in SYNCED_DOTFILES


def _hidden(rel: str) -> bool:
    return any(_hidden_name(part) for part in rel.split("/"))


class Mirror:
    """One local directory and one remote tree; remembers what it last saw in step."""

    def __init__(self, local_root: Path, remote: RemoteTree) -> None:
        self.local_root = Path(local_root)
        self.remote = remote
        self._synced: dict[str, Stat] = {}

    def push(self, prefixes: Iterable[str], *, delete: bool = True) -> list[str]:
        """Upload what changed locally under `prefixes`; with `delete`, remove remote files this
        side owns that are gone locally (a pruned checkpoint, a truncated metrics part).
        Returns the uploaded paths."""
        uploaded: list[str] = []
        for prefix in prefixes:
            local = self._local_files(prefix)
            remote = self.remote.listing(prefix)
            changed = []
            for rel, stat in local.items():
                if self._synced.get(rel) == stat:
                    continue
                # Pulled earlier (its mtime is the remote's). A file an earlier process pushed
                # is uploaded once more: the remote mtime is the upload's, not the file's.
                if _same(stat, remote.get(rel)):
                    self._synced[rel] = stat
                    continue
                changed.append((stat[1], rel, stat))
            for _, rel, stat in sorted(changed):
                try:
                    self.remote.upload(self.local_root / rel, rel)
                except FileNotFoundError:  # replaced or removed while we listed: next push
                    continue
                self._synced[rel] = stat
                uploaded.append(rel)
            if delete:
                for rel in sorted(set(remote) - set(local)):
                    self.remote.delete(rel)
                    self._synced.pop(rel, None)
        return uploaded

    def pull(
        self,
        prefixes: Iterable[str],
        *,
        delete: bool = True,
        overwrite: bool = True,
        skip_dirs: Iterable[str] = (),
    ) -> list[str]:
        """Download what changed remotely under `prefixes`; with `delete`, remove local files
        the remote no longer has; without `overwrite`, only fetch files absent locally; never
        anything inside a directory named in `skip_dirs`. Returns the downloaded paths."""
        downloaded: list[str] = []
        skipped = set(skip_dirs)
        for prefix in prefixes:
            remote = self.remote.listing(prefix)
            local = self._local_files(prefix)
            for rel, info in sorted(remote.items()):
                if _hidden(rel) or _inside(rel, skipped):
                    continue
                stat = local.get(rel)
                if stat is not None and (_same(stat, info) or not overwrite):
                    self._synced[rel] = stat
                    continue
                self.remote.download(rel, self.local_root / rel, info.mtime_ns)
                self._synced[rel] = (info.size, info.mtime_ns)
                downloaded.append(rel)
            if delete:
                for rel in set(local) - set(remote):
                    if _inside(rel, skipped):
                        continue
                    (self.local_root / rel).unlink(missing_ok=True)
                    self._synced.pop(rel, None)
        return downloaded

    def _local_files(self, prefix: str) -> dict[str, Stat]:
        if _hidden(prefix.strip("/")):  # `.harness.lock`, `.tmp-step-000004/`
            return {}
        start = self.local_root / prefix.strip("/") if prefix.strip("/") else self.local_root
        if start.is_file():
            rel = prefix.strip("/")
            return {} if _hidden(rel) else {rel: _stat(start)}
        found: dict[str, Stat] = {}
        for directory, dirs, files in os.walk(start):
            dirs[:] = [d for d in dirs if not _hidden_name(d)]
            for name in files:
                if _hidden_name(name):
                    continue
                path = Path(directory) / name
                rel = path.relative_to(self.local_root).as_posix()
                try:
                    found[rel] = _stat(path)
                except FileNotFoundError:  # removed while we walked
                    continue
        return found


def _inside(rel: str, dirs: set[str]) -> bool:
    """`rel` lies in a directory (at any depth) whose name is in `dirs`."""
    return bool(dirs.intersection(rel.split("/")[:-1]))


def _stat(path: Path) -> Stat:
    info = path.stat()
    return info.st_size, info.st_mtime_ns


def _same(stat: Stat, remote: RemoteFile | None) -> bool:
    return remote is not None and stat == (remote.size, remote.mtime_ns)
