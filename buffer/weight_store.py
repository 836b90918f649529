"""The weight store: one directory of safetensors per policy version, written atomically.

Design section 3: the learner publishes version v by writing `root/v{v:06d}/` and announcing its
path in Redis; generators load it by path. A version directory is self-contained (weights plus the
base model's config and tokenizer files), so vLLM can load it on its own. Directories are written
under a hidden temporary name in the same root, fsynced, and renamed into place, so a reader never
sees a partial version under its final name. The learner sees the store as a
`buffer.streams.WeightWriter`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from contract.durable import fsync_dir, fsync_file

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
# Files of a Hugging Face model directory that hold weights: never copied from the base model,
# since the version's own weights replace them.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
_WEIGHT_INDEXES = {"model.safetensors.index.json", "pytorch_model.bin.index.json"}
_VERSION_DIR = re.compile(r"^v(\d{6,})$")
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
# A version is written in well under a minute; a staging dir older than this belongs to a writer
# that crashed and is removed by `prune`.
STALE_STAGING_S = 3600.0


def version_dirname(version: int) -> str:
    if version < 0:
        raise ValueError(f"policy version {version} must be >= 0")
    return f"v{version:06d}"


class WeightStore:
    """Versioned weight directories under `root` (created if missing); one writer, many readers."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)

    def write(
        self,
        version: int,
        weights: nn.Module | Mapping[str, torch.Tensor],
        config_dir: str | os.PathLike[str] | None = None,
    ) -> str:
        """Write `version` atomically and return its directory.

        `weights` is a module (its state_dict is saved) or a state dict. Tensors sharing storage
        (tied embeddings) are saved once under their first name, as `save_pretrained` does.
        `config_dir` is the base model directory whose config/tokenizer files are copied along.
        Rewriting an existing version (a learner resumed after a crash redoes a step) replaces it.
        """
        final = self.root / version_dirname(version)
        staging = self.root / f"{_TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            state = weights.state_dict() if isinstance(weights, nn.Module) else dict(weights)
            save_file(_dedup_for_saving(state), str(staging / WEIGHTS_FILE))
            if config_dir is not None:
                _copy_config_files(Path(config_dir), staging)
            for path in staging.iterdir():
                fsync_file(path)
            fsync_dir(staging)
            if final.exists():
                logger.warning("weight store: replacing existing version %s", final)
                self._remove(final)
            os.rename(staging, final)
            fsync_dir(self.root)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return str(final)

    def path(self, version: int) -> str:
        """Directory of `version`; FileNotFoundError names the versions present if it is absent."""
        directory = self.root / version_dirname(version)
        if not directory.is_dir():
            raise FileNotFoundError(
                f"weight store {self.root} has no version {version} (present: {self.versions()}); "
                "it was never written, or pruned: raise keep_versions"
            )
        return str(directory)

    def versions(self) -> list[int]:
        """Complete versions present, ascending (temporary and trash directories are skipped)."""
        found = []
        for entry in self.root.iterdir():
            match = _VERSION_DIR.match(entry.name)
            if match and entry.is_dir():
                found.append(int(match.group(1)))
        return sorted(found)

    def latest(self) -> int | None:
        versions = self.versions()
        return versions[-1] if versions else None

    def prune(self, keep: int, protect: Iterable[int] = ()) -> list[int]:
        """Remove all but the newest `keep` versions, never one in `protect`; returns removed."""
        if keep < 1:
            raise ValueError(f"prune(keep={keep}): keep at least the newest version")
        protected = set(protect)
        versions = self.versions()
        doomed = [v for v in versions[:-keep] if v not in protected]
        for version in doomed:
            self._remove(self.root / version_dirname(version))
        self._clear_leftovers()
        return doomed

    def _clear_leftovers(self) -> None:
        """Delete trash, and staging dirs old enough to be from a writer that died mid-write."""
        cutoff = time.time() - STALE_STAGING_S
        for entry in self.root.iterdir():
            stale_staging = entry.name.startswith(_TMP_PREFIX) and entry.stat().st_mtime < cutoff
            if entry.name.startswith(_TRASH_PREFIX) or stale_staging:
                shutil.rmtree(entry, ignore_errors=True)

    def _remove(self, directory: Path) -> None:
        """Rename away first, so the version vanishes atomically even if deleting takes a while."""
        trash = self.root / f"{_TRASH_PREFIX}{directory.name}-{uuid.uuid4().hex[:8]}"
        os.rename(directory, trash)
        shutil.rmtree(trash, ignore_errors=True)


def read_state_dict(location: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """All tensors of the *.safetensors files in a version (or model) directory, on CPU."""
    files = sorted(Path(location).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{location} holds no *.safetensors file; pass a directory written by WeightStore.write"
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file), device="cpu"))
    return state


def _dedup_for_saving(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, one per distinct view: safetensors refuses shared memory.

    The same view under a second name (tied embeddings) is dropped, as `save_pretrained` does;
    a different view of an already seen storage is cloned.
    """
    views: set[tuple[int, int, tuple[int, ...]]] = set()
    storages: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        pointer = tensor.untyped_storage().data_ptr()
        view = (pointer, tensor.storage_offset(), tuple(tensor.shape))
        if view in views:
            continue
        cpu = tensor.detach().to("cpu").contiguous()
        out[name] = cpu.clone() if pointer in storages else cpu
        views.add(view)
        storages.add(pointer)
    return out


def _copy_config_files(source: Path, target: Path) -> None:
    if not source.is_dir():
        raise FileNotFoundError(f"config_dir {source} is not a directory (the base model dir)")
    for entry in source.iterdir():
        if not entry.is_file() or entry.name in _WEIGHT_INDEXES or entry.name.startswith("."):
            continue  # hidden: caches and temporaries of the model dir, not part of a version
        if entry.name.endswith(_WEIGHT_SUFFIXES):
            continue
        shutil.copyfile(entry, target / entry.name)
