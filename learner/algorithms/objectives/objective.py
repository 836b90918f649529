"""The shape of every policy objective: (checked batch, arm settings) -> terms and stats."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from learner.algorithms.objectives.inputs import PolicyBatch
from learner.algorithms.objectives.terms import PolicyTerms

ObjectiveCore = Callable[[PolicyBatch, Any], PolicyTerms]
"""(batch, settings) -> PolicyTerms; `settings` is the arm (`objectives.settings` Protocols)."""
TokenSelection = Callable[[PolicyBatch, Any], Tensor]
"""(batch, settings) -> bool [B, T]: the tokens an objective singles out by statistics of the
whole minibatch (Clip-Cov, KL-Cov), so a part of the minibatch cannot choose them alone."""


class PolicyObjective:
    """A policy objective: its core, a function of the checked `PolicyBatch` and the arm's
    settings returning `PolicyTerms`, and optionally the token selection it reads.

    The objective sees rows and computes their terms; it never divides by a count, so the same
    call serves a whole minibatch and a part of one (the update's reducer aggregates with the
    minibatch's totals). An objective that selects tokens by statistics of the whole minibatch
    declares its `select` (`PolicyObjective.selecting`): called on a batch without `selected`,
    it selects on those rows itself; a minibatch trained in parts computes `selection` once on
    all of it and gives each part its rows as `batch.selected`.
    """

    __name__: str

    def __init__(self, core: ObjectiveCore, select: TokenSelection | None = None) -> None:
        self.core = core
        self.select = select
        self.__name__ = core.__name__
        self.__doc__ = core.__doc__

    @classmethod
    def selecting(cls, select: TokenSelection) -> Callable[[ObjectiveCore], PolicyObjective]:
        """Decorator of a core that reads `batch.selected`, chosen by `select`."""
        return lambda core: cls(core, select)

    def __repr__(self) -> str:
        return f"PolicyObjective({self.__name__})"

    def __call__(self, batch: PolicyBatch, settings: Any) -> PolicyTerms:
        if self.select is not None:
            selected = batch.selected
            if selected is None:
                selected = self.select(batch, settings)
            elif selected.shape != batch.mask.shape:
                raise ValueError(
                    f"{self.__name__}: selected must be [B, T] = {tuple(batch.mask.shape)} (these "
                    f"rows of the minibatch's selection); got {tuple(selected.shape)}"
                )
            batch = replace(batch, selected=selected.bool() & batch.mask)
        return self.core(batch, settings)

    @torch.no_grad()
    def selection(self, batch: PolicyBatch, settings: Any) -> Tensor | None:
        """The tokens [B, T] this objective selects over the batch's rows (a whole minibatch),
        None for one that selects none; give each part its rows as `selected`."""
        return None if self.select is None else self.select(batch, settings)
