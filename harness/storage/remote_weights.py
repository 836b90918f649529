"""Weight versions through the bucket: the learner uploads, generators fetch on demand.

A version is announced in Redis only after `RemoteWeightStore.write` returns, and that returns
after every file of the version and then its `_COMPLETE` marker are uploaded; a generator takes
a version only if the marker is there, so it never loads half of one. The announced location is
the learner's local path, meaningless on another node: with a bucket, generators resolve the
version number to their own copy (`WeightFetcher`), downloading it once.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import torch
from torch import nn

from buffer.weight_store import WeightStore, version_dirname
from harness.storage.remote_tree import RemoteTree

COMPLETE: Final = "_COMPLETE"
_VERSION = re.compile(r"^v(\d{6,})$")


def remote_versions(remote: RemoteTree) -> list[int]:
    """Versions whose upload finished (their marker is present), ascending."""
    found = set()
    for rel in remote.listing():
        top, _, name = rel.partition("/")
        match = _VERSION.match(top)
        if match and name == COMPLETE:
            found.add(int(match.group(1)))
    return sorted(found)


class RemoteWeightStore(WeightStore):
    """A local WeightStore whose versions are also uploaded to `remote` (`<trial>/weights`)."""

    def __init__(self, root: str | os.PathLike[str], remote: RemoteTree) -> None:
        super().__init__(root)
        self.remote = remote

    def write(
        self,
        version: int,
        weights: nn.Module | Mapping[str, torch.Tensor],
        config_dir: str | os.PathLike[str] | None = None,
    ) -> str:
        location = super().write(version, weights, config_dir)
        name = version_dirname(version)
        self.remote.delete(f"{name}/{COMPLETE}")  # a rewrite (resume): never half-new, half-old
        for file in sorted(Path(location).iterdir()):
            self.remote.upload(file, f"{name}/{file.name}")
        self.remote.write_bytes(f"{name}/{COMPLETE}", b"")
        return location

    def prune(self, keep: int, protect: Iterable[int] = ()) -> list[int]:
        """Prune locally, then in the bucket by the same rule over every version either holds
        (a learner resumed on another node has only its newest versions locally)."""
        removed = super().prune(keep, protect)
        protected = set(protect)
        present = sorted(set(remote_versions(self.remote)) | set(self.versions()))
        for version in present[:-keep]:
            if version in protected:
                continue
            name = version_dirname(version)
            self.remote.delete(f"{name}/{COMPLETE}")  # first: readers stop taking it
            self.remote.delete_tree(name)
        return removed


class WeightFetcher:
    """A generator's local copies of the versions it loads, fetched from the bucket."""

    def __init__(self, local_root: Path, remote: RemoteTree, keep: int = 2) -> None:
        self.local_root = Path(local_root)
        self.remote = remote
        self.keep = keep
        self.local_root.mkdir(parents=True, exist_ok=True)

    def fetch(self, version: int) -> str:
        """The local directory of `version`, downloaded if this machine has not got it yet."""
        name = version_dirname(version)
        target = self.local_root / name
        if target.is_dir():
            return str(target)
        files = self.remote.listing(name)
        if f"{name}/{COMPLETE}" not in files:
            raise FileNotFoundError(
                f"weight version {version} is not complete in {self.remote.label} (announced, "
                "so it was pruned since: raise learner.keep_versions)"
            )
        staging = self.local_root / f".fetch-{name}-{uuid.uuid4().hex[:8]}"
        try:
            for rel in sorted(files):
                if not rel.endswith(f"/{COMPLETE}"):
                    self.remote.download(rel, staging / rel.partition("/")[2])
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._prune(keep_also=version)
        return str(target)

    def forget_after(self, version: int) -> list[int]:
        """Drop the local copies of versions after `version`: a bounded-mode rewind withdrew
        them (`buffer.timeline`), and the learner publishes other weights under those numbers,
        which `fetch` must download again instead of serving the withdrawn copy. Returns the
        versions dropped."""
        dropped = sorted(
            int(m.group(1))
            for entry in self.local_root.iterdir()
            if (m := _VERSION.match(entry.name)) and entry.is_dir() and int(m.group(1)) > version
        )
        for withdrawn in dropped:
            shutil.rmtree(self.local_root / version_dirname(withdrawn), ignore_errors=True)
        return dropped

    def _prune(self, keep_also: int) -> None:
        """Keep the newest `keep` fetched versions (and the one just fetched): loaded weights
        live in the engine, the files are only needed again by a restart."""
        present = sorted(
            int(m.group(1))
            for entry in self.local_root.iterdir()
            if (m := _VERSION.match(entry.name)) and entry.is_dir()
        )
        for version in present[: -self.keep]:
            if version != keep_also:
                shutil.rmtree(self.local_root / version_dirname(version), ignore_errors=True)
