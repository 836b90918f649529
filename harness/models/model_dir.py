"""The model directory of a run: found without importing torch or transformers once built.

The built-in model is built once per cache key (model config minus cache_dir, task settings,
FORMAT_VERSION, library versions) into `cache_dir/<key>`: in a temporary directory renamed into
place when complete (readers never see half a model), under an fcntl lock (concurrent trials
wait instead of building twice).

A trial's supervisor (and `harness run`'s checks) only need the path of the built-in model's
cached build, its weights' digest and a user directory's validation: importing the builder
(torch and transformers' model classes, about 3 CPU-s) is paid only when a build is missing, so
starting a trial costs a fraction of a second here. The build itself is `factory.build_builtin`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from contract.durable import file_digest
from contract.record import write_json_atomic
from harness.config import (
    ConfigError,
    ModelConfig,
    TaskConfig,
    check_response_fits,
    resolved_dump,
)
from harness.file_lock import file_lock

logger = logging.getLogger(__name__)

# Bump whenever the bytes a build produces change for the same config (tokenizer vocabulary, task
# generators, warm-start recipe, saved files), so stale cache entries are never reused.
FORMAT_VERSION = 2
# A warm start of the default config takes seconds; a large one minutes. Waiting longer than this
# for another process's build means that process is stuck.
LOCK_TIMEOUT_S = 1800.0


def builtin_cache_key(model_cfg: ModelConfig, task_cfg: TaskConfig) -> str:
    """Hex digest of everything that determines the built-in model's files."""
    task: dict[str, Any] = resolved_dump(task_cfg)
    if task_cfg.name == "file" and task_cfg.path is not None:
        task["path_sha256"] = file_digest(Path(task_cfg.path).expanduser())
    else:
        task["path"] = None  # no effect on procedural tasks
    payload = {
        "model": model_cfg.model_dump(mode="json", exclude={"cache_dir"}),
        "task": task,
        "format_version": FORMAT_VERSION,
        "transformers": importlib.metadata.version("transformers"),
        "torch": importlib.metadata.version("torch"),  # as torch.__version__
    }
    canonical = json.dumps(payload, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def _build_cached(model_cfg: ModelConfig, task_cfg: TaskConfig) -> Path:
    cache_dir = Path(model_cfg.cache_dir).expanduser()
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = builtin_cache_key(model_cfg, task_cfg)
    final = cache_dir / key
    # An fcntl lock dies with its holder, so deleting the file would not free it (and would
    # let a second builder in): the holder is a live process, find it (`fuser <lock>`).
    building = "another live process building this model (find it with `fuser` on the lock)"
    with file_lock(cache_dir / f"{key}.lock", LOCK_TIMEOUT_S, building):
        if final.is_dir():  # renamed into place only when complete
            return final
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.building-", dir=cache_dir))
        try:
            logger.info("building built-in model %s (%s)", key, model_cfg.arch)
            from harness.models.factory import build_builtin  # torch: only to build

            # not `final`'s name: the staging directory's
            info = {"format_version": FORMAT_VERSION, "cache_key": key}
            build_builtin(model_cfg, task_cfg, staging, info)
            os.rename(staging, final)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    return final


class ModelPathError(ConfigError, FileNotFoundError):
    """model.path names no usable model directory. A ConfigError, so the command line prints it
    as one line naming the field instead of a traceback."""


def validate_model_dir(path: Path) -> Path:
    """A user model directory must hold config.json and tokenizer files the harness can load."""
    if not path.is_dir():
        missing = "" if path.exists() else " (nothing is there)"
        raise ModelPathError(
            f"model.path {path} is not a directory{missing}; set model.path to a local Hugging "
            "Face model directory or to `builtin`"
        )
    if not (path / "config.json").is_file():
        raise ModelPathError(f"model.path {path} has no config.json (not a Hugging Face model)")
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise ModelPathError(
            f"model.path {path} has no tokenizer.json/tokenizer_config.json; save the tokenizer "
            "next to the model (tokenizer.save_pretrained)"
        )
    return path


def check_model_context(path: Path, max_new_tokens: int) -> None:
    """generation.max_new_tokens must leave room for a prompt in the context that the model
    directory's config.json declares (`max_position_embeddings`, top level or `text_config`;
    a config without one is not checked)."""
    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelPathError(f"model.path {path}: cannot read config.json ({exc})") from None
    if not isinstance(config, dict):
        raise ModelPathError(f"model.path {path}: config.json does not hold a JSON object")
    text_config = config.get("text_config")
    nested = text_config if isinstance(text_config, dict) else {}
    context = config.get("max_position_embeddings", nested.get("max_position_embeddings"))
    if isinstance(context, int) and not isinstance(context, bool):
        try:
            check_response_fits(
                max_new_tokens,
                context,
                f"max_position_embeddings={context} in {config_file}",
                "lower generation.max_new_tokens",
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def build_model_dir(model_cfg: ModelConfig, task_cfg: TaskConfig) -> Path:
    """The model directory of a run: the cached built-in build, or the validated user path."""
    if model_cfg.path == "builtin":
        return _build_cached(model_cfg, task_cfg)
    return validate_model_dir(Path(model_cfg.path).expanduser())


DIGEST_CACHE = ".weights_digest.json"  # hidden: never copied into weight versions or synced


def weights_digest(model_dir: Path | str) -> str:
    """sha256 over the safetensors files (names and bytes, sorted): equal digests, equal weights.

    The supervisor, the learner and every generator (at each restart) check a model by its
    digest; hashing 15 GB takes about 10 s, so the digest is cached beside the files, keyed by
    each file's name, size, mtime and inode (the rule `make` and rsync trust; a copy or an
    in-place rewrite changes one of them). A read-only model dir just goes uncached.
    """
    root = Path(model_dir)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    stats = []
    for path in files:
        info = path.stat()
        stats.append([path.name, info.st_size, info.st_mtime_ns, info.st_ino])
    cache = root / DIGEST_CACHE
    try:
        cached = json.loads(cache.read_text())
        if cached.get("files") == stats:
            return str(cached["digest"])
    except (OSError, ValueError, AttributeError):
        pass
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\x00")
        digest.update(bytes.fromhex(file_digest(path)))
    with contextlib.suppress(OSError):  # a read-only model dir (a shared mount): uncached
        write_json_atomic(cache, {"files": stats, "digest": digest.hexdigest()})
    return digest.hexdigest()


__all__ = [
    "FORMAT_VERSION",
    "ModelPathError",
    "build_model_dir",
    "builtin_cache_key",
    "check_model_context",
    "validate_model_dir",
    "weights_digest",
]
