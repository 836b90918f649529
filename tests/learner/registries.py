"""Leave the process-wide objective registries as a test found them (plugins register into them)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from learner.algorithms import objectives
from learner.config import ARM_MODELS
from learner.config.plugin_records import LOADED


@contextlib.contextmanager
def restored_registries() -> Iterator[None]:
    """Snapshot the arm models, the losses and the loaded-plugin records; restore them after."""
    arms, losses, loaded = dict(ARM_MODELS), dict(objectives._LOSSES), dict(LOADED)
    try:
        yield
    finally:
        for registry, snapshot in (
            (ARM_MODELS, arms),
            (objectives._LOSSES, losses),
            (LOADED, loaded),
        ):
            registry.clear()
            registry.update(snapshot)
