"""Taking a step's batch (rank 0): the groups it trains, under the trial's staleness rule, each
checked at intake, none trained twice.

The buffer checks every group against the rules the taker hands it (`buffer.intake`) as it is
read, before it can take a slot: a refused one goes to the dead letter and the real group still
fills its slot. Fixed mode raises `SlotRefusedError` when a slot the trial needs can never be
filled. An arm with dynamic sampling reads extra rounds of the batch
(`learner.runtime.dynamic_sampling`). A redelivered copy of a group already consumed (trained,
or read and filtered) is acked, never trained again: the taker keeps the consumed ids, seeded
with the checkpoint's, and hands them to the next checkpoint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import partial

from buffer.intake import IntakeRules, ModelLimits, TrialSlots
from buffer.streams import Delivery, RolloutSource, draw_key
from buffer.timeline import Timeline
from learner.runtime.dynamic_sampling import take_dynamic
from learner.runtime.task import LearnerTask


@dataclass(frozen=True)
class Taken:
    """What one step read: the groups it trains, those dropped as too stale (bounded mode;
    already acked), every group it consumed (trained and, under dynamic sampling, filtered or
    surplus: settled at the checkpoint) and the dynamic-sampling metrics."""

    trained: list[Delivery]
    dropped: list[Delivery]
    consumed: list[Delivery]
    sampling_metrics: dict[str, float] = field(default_factory=dict)
    taken_at: float = math.nan  # the learner's wall clock at the take (staleness accounting)
    withdrawn: list[Delivery] = field(default_factory=list)  # made from withdrawn weights


# What ranks > 0 take: nothing (rank 0 broadcasts the collated batch).
NOTHING = Taken([], [], [])


def intake_rules(task: LearnerTask, limits: ModelLimits) -> IntakeRules:
    """The intake rules of `task`'s trial for a model of `limits`."""
    return IntakeRules(
        mode=task.mode,
        lag=task.lag,
        sync_every=task.sync_every,
        seed=task.seed,
        prompts_per_step=task.learner.prompts_per_step,
        group_size=task.group_size,
        max_new_tokens=task.max_new_tokens,
        reward_range=task.learner.reward_range,
        limits=limits,
        prompt_ids=task.prompt_ids,
        extra_rounds=task.arm.sampling_rounds(),
    )


class BatchTaker:
    """Rank 0's reader of the buffer: one `take` per step, one `settle` once the step trained."""

    def __init__(
        self,
        buffer: RolloutSource,
        task: LearnerTask,
        limits: ModelLimits,
        *,
        trained: Iterable[str],
        timeline: Timeline | None = None,
    ) -> None:
        """`timeline` (bounded mode): the run's rewinds; groups made from weights they
        withdrew are dropped and their prompts made again (`buffer.timeline`)."""
        self.buffer, self.task, self.timeline = buffer, task, timeline
        self.rules = intake_rules(task, limits)
        self.slots = TrialSlots(
            task.seed, task.learner.prompts_per_step, task.total_steps, self.rules.extra_rounds
        )
        self.trained = set(trained)  # consumed ids: the checkpoint's, then each step's
        # chosen once: by batch index (fixed lag, exact replays) or in arrival order (bounded)
        exact = task.policy.replays_exactly
        self._take_step = self._take_fixed if exact else self._take_bounded

    def take(self, step: int) -> Taken:
        """The groups of step `step`, skipping ones already consumed, and the groups dropped as
        too stale meanwhile (bounded mode; already acked by the buffer), stamped with the time
        they were handed over."""
        taken = self._take_step(step)
        # Arrival order must not matter in fixed mode: train in prompt order (round 0 first).
        trained = sorted(taken.trained, key=lambda d: (d.group.prompt_index, d.group.group_id))
        return replace(taken, trained=trained, taken_at=time.time())

    def settle(self, taken: Taken) -> list[str]:
        """Count `taken`'s consumed groups as trained (none is read again); returns every
        consumed id, sorted: what the next checkpoint records as trained."""
        self.trained.update(d.group.group_id for d in taken.consumed)
        return sorted(self.trained)

    def _take_fixed(self, step: int) -> Taken:
        n, task = self.rules.prompts_per_step, self.task

        def take_round(round_index: int) -> list[Delivery]:
            got = self.buffer.take_batch(
                draw_key(step, round_index),
                n,
                task.consumer,
                task.take_timeout_s,
                rules=self.rules,
                slots=self.slots,
            )
            return self._without_trained(got, step, fixed=True)

        if not self.rules.extra_rounds:
            got = take_round(0)
            return Taken(got, [], got)
        selection = take_dynamic(
            take_round,
            partial(self.buffer.request_round, step, prompts_per_step=n),
            n_groups=n,
            max_extra_rounds=self.rules.extra_rounds,
        )
        return Taken(selection.trained, [], selection.consumed, selection.metrics())

    def _take_bounded(self, step: int) -> Taken:
        task = self.task
        taken = self.buffer.take(
            self.rules.prompts_per_step,
            step,
            task.max_lag,
            task.consumer,
            task.take_timeout_s,
            rules=self.rules,
            timeline=self.timeline,
        )
        fresh = self._without_trained(taken.deliveries, step, fixed=False)
        return Taken(fresh, taken.dropped, fresh, withdrawn=taken.withdrawn)

    def _without_trained(
        self, deliveries: list[Delivery], step: int, *, fixed: bool
    ) -> list[Delivery]:
        """`deliveries` without redelivered copies of committed groups, which are acked, never
        retrained. Fixed mode reads each batch (and round) once, so any such copy means the
        run's Redis and the checkpoint disagree; bounded mode only when nothing else came."""
        fresh = [d for d in deliveries if d.group.group_id not in self.trained]
        if len(fresh) != len(deliveries):
            stale_ids = [d.entry_id for d in deliveries if d.group.group_id in self.trained]
            self.buffer.ack(stale_ids)
            if fixed or not fresh:
                raise RuntimeError(
                    f"step {step}: the buffer redelivered groups already trained "
                    f"({len(stale_ids)}); the run's Redis state and checkpoint disagree"
                )
        return fresh
