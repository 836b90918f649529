"""The arm registry: what each objective needs from a learner step (design section 6).

Everything that differs between arms is declared here, once per objective: which advantage
estimator feeds it, whether it trains a critic, which settings reach its loss, how its loss is
aggregated (hence which units data-parallel ranks rescale by), and its paper-default clip range.
The learner asks these declared properties (`arm_spec(name).needs_value_model`, ...) and never
compares objective names itself, so adding an arm is one loss function plus one entry in `ARMS`.

This module imports no torch: `learner.config` fills clip defaults from it, and loading a config
must stay cheap. The loss functions (torch) are imported on first use of `ArmSpec.loss`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from learner.config import ArmConfig
    from learner.objectives import PolicyLoss

Objective = Literal["gspo", "gspo_token", "grpo", "ppo"]
LossAggregation = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
AdvantageNorm = Literal["std", "mean_only"]
KLEstimator = Literal["k1", "k2", "k3"]

AdvantageKind = Literal["group", "gae"]
"""`group`: group-relative, one advantage per sequence [B] (GRPO/GSPO; sequence-level).
`gae`: GAE on the critic's values with a terminal reward, whitened, per token [B, T] (PPO)."""

LossUnits = Literal["tokens", "sequences"]
"""What a policy loss averages over: response tokens (token-mean) or non-empty sequences."""

OptionName = Literal["eps_low", "eps_high", "agg", "max_len", "beta", "kl_estimator"]
"""The fields of `ObjectiveOptions`."""


@dataclass(frozen=True)
class ObjectiveOptions:
    """Every setting a policy objective reads, as one value built once per step.

    The objectives are pure functions of (tensors..., options). Clip defaults are not repeated
    here: they belong to the objective (`ArmSpec.default_clip`, `ArmSpec.default_options`).
    """

    eps_low: float
    """Lower clip range: ratios below 1 - eps_low are clipped (for A < 0)."""
    eps_high: float
    """Upper clip range: ratios above 1 + eps_high are clipped (for A > 0); > eps_low is DAPO's
    clip-higher."""
    agg: LossAggregation = "seq-mean-token-mean"
    """Token aggregation (`learner.masking`); read by GRPO and PPO only (GSPO's is fixed)."""
    max_len: int | None = None
    """Dr. GRPO's constant divisor, needed by `seq-mean-token-sum-norm` only."""
    beta: float = 0.0
    """KL-to-reference coefficient; 0 = no penalty (the KL is still measured when given)."""
    kl_estimator: KLEstimator = "k3"
    """Estimator of the reference KL term (Schulman's k1/k2/k3)."""


@dataclass(frozen=True)
class ArmSpec:
    """How one objective behaves in a learner step. Declarations only; no logic by name."""

    objective: Objective
    loss_path: str
    """`module:function` of the pure loss (a `PolicyLoss`), imported on first use."""
    advantages: AdvantageKind
    needs_value_model: bool
    """Whether the arm trains a critic (value model, its own optimiser, value loss)."""
    options: frozenset[OptionName]
    """The `ObjectiveOptions` fields taken from the arm's settings; the others keep the
    objective's fixed values (`aggregation`, no `max_len`)."""
    aggregation: LossAggregation | None
    """The objective's fixed aggregation, or None when the arm's `agg` chooses it."""
    default_clip: tuple[float, float]
    """(eps_low, eps_high) when the arm sets none: the paper's defaults."""
    same_gradient_as: Objective | None = None
    """An objective whose loss value and gradient this one equals under sequence-level
    (`group`) advantages without per-token IS weights (design section 6)."""

    @property
    def loss(self) -> PolicyLoss:
        """The objective's pure loss function."""
        return _resolve(self.loss_path)

    def effective_aggregation(self, agg: LossAggregation) -> LossAggregation:
        """The aggregation the loss uses when the arm asks for `agg`."""
        return agg if self.aggregation is None else self.aggregation

    def loss_units(self, agg: LossAggregation) -> LossUnits:
        """What the loss averages over (data-parallel ranks rescale by it): tokens for
        token-mean (DAPO, PPO), else non-empty sequences (GSPO, GSPO-token, GRPO seq-mean-*)."""
        return "tokens" if self.effective_aggregation(agg) == "token-mean" else "sequences"

    def default_options(self, max_len: int | None = None) -> ObjectiveOptions:
        """Options of an arm that sets nothing but its objective."""
        low, high = self.default_clip
        return ObjectiveOptions(
            eps_low=low,
            eps_high=high,
            agg=self.effective_aggregation("seq-mean-token-mean"),
            max_len=max_len if "max_len" in self.options else None,
        )


@cache
def _resolve(path: str) -> PolicyLoss:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


_CLIP_GSPO = (3e-4, 4e-4)  # Zheng et al. 2025, sec. 5.1: the sequence ratio is clipped tightly
_CLIP_PPO = (0.2, 0.2)  # the usual token-level range (Schulman et al. 2017; Shao et al. 2024)
_SHARED: frozenset[OptionName] = frozenset({"eps_low", "eps_high", "beta", "kl_estimator"})

ARMS: Mapping[Objective, ArmSpec] = MappingProxyType(
    {
        "gspo": ArmSpec(
            objective="gspo",
            loss_path="learner.objectives:gspo_loss",
            advantages="group",
            needs_value_model=False,
            options=_SHARED,
            aggregation="seq-mean-token-mean",  # mean of sequence terms; KL per sequence too
            default_clip=_CLIP_GSPO,
        ),
        "gspo_token": ArmSpec(
            objective="gspo_token",
            loss_path="learner.objectives:gspo_token_loss",
            advantages="group",
            needs_value_model=False,
            options=_SHARED,
            aggregation="seq-mean-token-mean",
            default_clip=_CLIP_GSPO,
            same_gradient_as="gspo",
        ),
        "grpo": ArmSpec(
            objective="grpo",
            loss_path="learner.objectives:grpo_loss",
            advantages="group",
            needs_value_model=False,
            options=_SHARED | {"agg", "max_len"},
            aggregation=None,  # original GRPO, DAPO's token-mean or Dr. GRPO's constant norm
            default_clip=_CLIP_PPO,
        ),
        "ppo": ArmSpec(
            objective="ppo",
            loss_path="learner.objectives:ppo_loss",
            advantages="gae",
            needs_value_model=True,
            options=_SHARED,
            aggregation="token-mean",  # CleanRL; PPO as usually run for LLMs
            default_clip=_CLIP_PPO,
        ),
    }
)
"""Objective name -> its declared behaviour; keys are exactly the `Objective` literal."""

OBJECTIVE_NAMES: tuple[str, ...] = get_args(Objective)


def arm_spec(objective: Objective | str) -> ArmSpec:
    """The one lookup by name; the error lists the registered objectives."""
    try:
        return ARMS[objective]  # type: ignore[index]
    except KeyError:
        raise ValueError(
            f"unknown objective {objective!r}; registered objectives are {OBJECTIVE_NAMES}"
        ) from None


def objective_options(arm: ArmConfig, max_len: int | None) -> ObjectiveOptions:
    """The arm's settings as the loss reads them: built once per step from the config.

    `max_len` is the generation cap (Dr. GRPO's divisor). Settings the objective does not take
    (`ArmSpec.options`) keep its fixed values, so they cannot change its numbers.
    """
    spec = arm_spec(arm.objective)
    assert arm.eps_low is not None and arm.eps_high is not None, "ArmConfig fills clip defaults"
    taken = {
        "eps_low": arm.eps_low,
        "eps_high": arm.eps_high,
        "agg": arm.agg,
        "max_len": max_len,
        "beta": arm.beta,
        "kl_estimator": arm.kl_estimator,
    }
    fields = {name: value for name, value in taken.items() if name in spec.options}
    return replace(spec.default_options(), **fields)
