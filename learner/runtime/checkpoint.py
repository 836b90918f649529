"""Checkpoints that make a killed trial resumable bit for bit.

A checkpoint holds everything the next step's arithmetic depends on: policy (and value model)
weights, optimiser and scheduler state, the RNG states of torch, numpy and python, the step, and
the ids of groups already trained (so redelivered groups are skipped: exactly-once training,
design section 9). It is written to a temporary directory and renamed into place, and
`latest.json` is replaced atomically last, so a kill at any moment leaves the previous
checkpoint intact. Loading uses `torch.load(weights_only=True)`: these files are our own, but
nothing here ever executes pickled code.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch


@dataclass
class TrainingState:
    """The learner's mutable state besides module weights."""

    step: int = 0
    updates: int = 0
    trained_group_ids: list[str] = field(default_factory=list)
    grad_norm_history: list[float] = field(default_factory=list)
    grad_spikes: int = 0


def capture_rng() -> dict[str, Any]:
    np_state = np.random.get_state()  # noqa: NPY002 - the global RNG is what libraries use
    return {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
    }


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    restored = (kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached)
    np.random.set_state(restored)  # noqa: NPY002
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


class CheckpointStore:
    """`<trial>/checkpoints/step-NNNNNN/` directories plus an atomically replaced `latest.json`."""

    def __init__(self, root: Path, keep: int = 2) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def latest_step(self) -> int | None:
        pointer = self.root / "latest.json"
        if not pointer.exists():
            return None
        return int(json.loads(pointer.read_text())["step"])

    def save(self, state: TrainingState, modules: dict[str, Any]) -> Path:
        """Write modules' state dicts (models, optimisers, schedulers) and `state` for a step."""
        final = self.root / f"step-{state.step:06d}"
        tmp = self.root / f".tmp-step-{state.step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        payload = {name: module.state_dict() for name, module in modules.items()}
        payload["rng"] = capture_rng()
        payload["training_state"] = {
            "step": state.step,
            "updates": state.updates,
            "trained_group_ids": list(state.trained_group_ids),
            "grad_norm_history": list(state.grad_norm_history),
            "grad_spikes": state.grad_spikes,
        }
        torch.save(payload, tmp / "state.pt")
        _fsync_dir(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        pointer_tmp = self.root / ".latest.json.tmp"
        pointer_tmp.write_text(json.dumps({"step": state.step, "dir": final.name}))
        pointer_tmp.replace(self.root / "latest.json")
        self._prune(state.step)
        return final

    def load(self, modules: dict[str, Any]) -> TrainingState:
        """Restore modules and RNG states in place from the latest checkpoint."""
        step = self.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {self.root}; start without --resume")
        payload = torch.load(self.root / f"step-{step:06d}" / "state.pt", weights_only=True)
        for name, module in modules.items():
            module.load_state_dict(payload[name])
        restore_rng(payload["rng"])
        return TrainingState(**payload["training_state"])

    def _prune(self, newest: int) -> None:
        steps = sorted(int(p.name.split("-")[1]) for p in self.root.glob("step-*") if p.is_dir())
        for old in steps[: max(0, len(steps) - self.keep)]:
            if old != newest:
                shutil.rmtree(self.root / f"step-{old:06d}", ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    for child in path.iterdir():
        with child.open("rb") as handle:
            os.fsync(handle.fileno())
