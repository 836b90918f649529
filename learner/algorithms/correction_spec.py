"""An arm's off-policy correction as configuration: names, levels, default bounds (no torch).

`learner.config.arms` validates arms with it and must stay cheap to import; the weights themselves
are computed in `learner.algorithms.corrections`, whose docstring defines every correction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from learner.vocabulary import Correction
from learner.vocabulary import CorrectionLevel as Level

CORRECTIONS: tuple[str, ...] = get_args(Correction)

DEFAULT_BOUNDS: dict[str, tuple[float | None, float]] = {
    "naive": (None, 0.0),
    "proximal": (None, 0.0),
    "decoupled": (None, 0.0),
    "tis_token": (2.0, 0.0),
    "tis_seq": (2.0, 0.0),
    "mis_token": (2.0, 0.0),
    "mis_seq": (2.0, 0.0),
    "mis_geo": (2.0, 0.5),
    "icepop": (5.0, 0.5),
}
"""(cap C, low) when an arm sets none: the references' usual values (C = 2 as `learner.is_cap`)."""

LEVELS: dict[str, Level] = {
    "naive": "token",
    "proximal": "token",
    "decoupled": "token",
    "tis_token": "token",
    "tis_seq": "sequence",
    "mis_token": "token",
    "mis_seq": "sequence",
    "mis_geo": "sequence",
    "icepop": "token",
}
"""Whether a correction's weight is per token or one per sequence (constant on its tokens)."""
UNWEIGHTED = frozenset({"naive", "proximal"})
"""Corrections that multiply no term: they choose pi_old only."""


@dataclass(frozen=True)
class CorrectionSpec:
    """One arm's correction with its resolved bounds."""

    kind: Correction
    cap: float | None  # upper bound C (truncation or mask); None: no upper bound
    low: float = 0.0  # lower mask bound; 0: none

    def __post_init__(self) -> None:
        if self.kind not in CORRECTIONS:
            raise ValueError(f"unknown correction {self.kind!r}; choose one of {CORRECTIONS}")
        if self.cap is not None and self.cap <= 0:
            raise ValueError(f"correction cap must be > 0, got {self.cap}")
        if self.low < 0 or (self.cap is not None and self.low >= self.cap):
            raise ValueError(f"correction bounds need 0 <= low < cap; got low={self.low}")

    @property
    def uses_proximal(self) -> bool:
        """pi_old is the learner's recompute (pi_prox), not the behaviour logprobs."""
        return self.kind != "naive"

    @property
    def level(self) -> Level:
        return LEVELS[self.kind]

    @property
    def weighted(self) -> bool:
        """The objective's terms get weights (every correction but naive and proximal)."""
        return self.kind not in UNWEIGHTED

    @property
    def token_weights(self) -> bool:
        """Each token gets its own weight (weighted, token level)."""
        return self.weighted and self.level == "token"


def correction_spec(
    kind: Correction, cap: float | None = None, low: float | None = None
) -> CorrectionSpec:
    """The spec with the correction's default bounds filling what is not given."""
    default_cap, default_low = DEFAULT_BOUNDS[kind]
    return CorrectionSpec(
        kind, default_cap if cap is None else cap, default_low if low is None else low
    )
