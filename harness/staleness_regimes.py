"""The staleness regime each arm's trials run under: the experiment's `staleness` section with
the arm's own `staleness` fields on top (`learner.config.arm_staleness`, why regimes are arms).

Every reader of a trial's regime (the grid's lags, the generators' partial rollouts and sync
interval, the learner's intake, the buffer-depth rule, the report's policy column) goes through
`arm_regime`, so an arm's override cannot reach one of them and miss another.
"""

from __future__ import annotations

from dataclasses import dataclass

from buffer.config import StalenessConfig
from buffer.staleness import POLICIES
from learner.config import ArmBase
from learner.config.arm_staleness import ArmStaleness


@dataclass(frozen=True)
class Regime:
    """One arm's staleness settings, resolved."""

    lags: tuple[int, ...]
    partial_rollouts: bool
    sync_every: int

    @property
    def oldest(self) -> int:
        """How many versions behind the learner a group of this regime may be (its largest
        lag, plus sync_every - 1 for a generator that loads weights only every k steps)."""
        return max(self.lags) + self.sync_every - 1


def arm_regime(staleness: StalenessConfig, arm: ArmBase) -> Regime:
    """The arm's regime: its own fields where set, the experiment's elsewhere."""
    own = arm.staleness or ArmStaleness()
    return Regime(
        lags=tuple(staleness.lags) if own.lags is None else own.lags,
        partial_rollouts=(
            staleness.partial_rollouts if own.partial_rollouts is None else own.partial_rollouts
        ),
        sync_every=staleness.sync_every if own.sync_every is None else own.sync_every,
    )


def check_arm_regimes(staleness: StalenessConfig, arms: list[ArmBase]) -> None:
    """An arm's lags are some of the experiment's (the grid's axis), and its partial rollouts
    need bounded mode: each refused in one line naming `arms[i].staleness.<field>`."""
    for index, arm in enumerate(arms):
        own = arm.staleness
        if own is None:
            continue
        where = f"arms[{index}].staleness"
        if own.lags is not None and not set(own.lags) <= set(staleness.lags):
            extra = sorted(set(own.lags) - set(staleness.lags))
            raise ValueError(
                f"{where}.lags of arm {arm.name!r} has {extra}, which staleness.lags "
                f"{list(staleness.lags)} does not: an arm runs at some of the experiment's lags; "
                "add them to staleness.lags"
            )
        where_partial = f"{where}.partial_rollouts of arm {arm.name!r}"
        problem = POLICIES[staleness.mode].refusal("partial_rollouts", where_partial)
        if own.partial_rollouts and problem:
            raise ValueError(problem)
