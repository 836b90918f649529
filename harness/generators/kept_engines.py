"""vLLM engines kept across the trials of a warm generator process (executor.warm_components).

A vLLM engine takes 20 s to start on CPU and minutes with CUDA graphs on a large model, against
milliseconds to put its weights back. A warm generator process (`harness.cli_warm`)
therefore keeps the engine its last trial used and hands it to the next trial whose engine would
be the same: same backend settings, same model files but the weights (config, tokenizer). The
next trial gets it on that trial's initial weights (version 0 from its model directory, the
reload the weight-sync path uses, prefix cache reset) and its sampling settings; any other
engine is closed first. Every sample is seeded by its own seed, so nothing an engine did before
reaches a sample; tests pin warm trials bitwise to cold ones.

The torch generator is not kept: it builds in milliseconds, and a fresh one is simplest.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.config import GenerationConfig
from harness.generators.base import Generator
from harness.launch.warm_protocol import WARM_ENGINES_ENV

# The small files an engine reads besides the weights (config, tokenizer, chat template); never
# weight files of any format, which may be gigabytes, nor hidden caches (the weights digest).
_ENGINE_FILES = frozenset({".json", ".model", ".txt", ".jinja", ".tiktoken"})
_kept: dict[str, Generator] = {}  # at most one: the engine of the last trial


class _Lease:
    """A kept engine as one trial sees it: everything but `close`, which keeps it."""

    def __init__(self, engine: Generator) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def close(self) -> None:
        """Kept for the process's next trial (the process's exit releases it)."""


def engine_key(gen_cfg: GenerationConfig, model_dir: Path) -> str:
    """What decides whether an engine can serve another trial: its settings and the model's
    files other than the weights (config.json, tokenizer, generation config, build reports)."""
    files = {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(model_dir.iterdir())
        if path.is_file() and path.suffix in _ENGINE_FILES and not path.name.startswith(".")
    }
    settings = gen_cfg.model_dump(
        include={
            "backend",
            "device",
            "dtype",
            "threads",
            "gpu_memory_utilization",
            "cpu_kvcache_space_gb",
        }
    )
    blob = json.dumps({"settings": settings, "files": files}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def kept_or_new(
    gen_cfg: GenerationConfig, model_dir: Path, build: Callable[[], Generator]
) -> Generator:
    """In a warm process, a vLLM engine kept from an earlier trial (on `model_dir`'s weights and
    `gen_cfg`'s sampling) or a new one that is kept; otherwise `build()`."""
    if os.environ.get(WARM_ENGINES_ENV) != "1" or gen_cfg.backend != "vllm":
        return build()
    key = engine_key(gen_cfg, model_dir)
    engine = _kept.get(key)
    if engine is None:
        for other in _kept.values():
            other.close()
        _kept.clear()
        engine = _kept[key] = build()
    else:
        engine.load_weights(0, str(model_dir))
        engine.sampling = gen_cfg.sampling()
    return _Lease(engine)  # type: ignore[return-value]


__all__ = ["engine_key", "kept_or_new"]
