"""Learning-rate schedule: linear warm-up, then constant or cosine decay to 10% of the peak."""

from __future__ import annotations

import math

from learner.vocabulary import LRSchedule


def lr_multiplier(update: int, warmup: int, total: int, schedule: LRSchedule) -> float:
    """Multiplier of the peak LR at optimiser update `update` (0-based) of `total`."""
    if warmup > 0 and update < warmup:
        return (update + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (update - warmup) / span)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))
