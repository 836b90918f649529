"""The learner's side of one run's buffer: take groups, then commit (or reject) them.

One Redis stream per run (`gspo:{run_id}:rollouts`) with one consumer group, which only this side
creates (`RolloutConsumer.__init__`, from id 0: groups pushed before it are kept). Delivery is
at-least-once (an entry stays pending until the learner commits its step) and training is
exactly-once: `commit` records the group ids as trained in the same MULTI as the ack, the learner
also keeps them in its checkpoint (and skips them if they are delivered again), and a group whose
id is already trained or held is acked as a duplicate, never delivered.

Depth = stream length: settled entries are deleted (XACK + XDEL), so the stream holds exactly the
unconsumed plus the read-but-unacked groups (producers block on it: `buffer.producer`).

Fixed staleness (`take_batch`) returns the groups of one batch index whatever their arrival order
(or of one extra round of a batch, keyed by `buffer.tickets.draw_key`; the floor below which
late groups are dropped compares batches, so a round never makes its own batch late).
A group its `accept` check refuses is dead-lettered before it is stashed or held, so it never takes
a real group's place; if the refused copy is the one the outbox admitted under its id, no other
copy of that id can be pushed, and a take that needs it raises SlotRefusedError at once instead of
waiting out its timeout. Early arrivals of later batches are stashed in memory while staying
pending in Redis, so a restarted learner gets them back from its pending list. The stash is bounded
by max_depth, which must therefore be >= (lag + 1) * prompts_per_step or the learner could wait on
groups that cannot be pushed. Bounded staleness (`take`) returns groups in arrival order and drops
(acks and counts) those older than max_lag versions.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Collection, Container, Iterable
from dataclasses import dataclass, field

import redis

from buffer.config import BufferConfig
from buffer.connection import RunKeys
from buffer.inbox import Delivery, Inbox, settle
from buffer.intake import Check, IntakeRules, intake_check
from buffer.outbox import group_digest
from buffer.rewind import (
    BoundedRewind,
    Rewound,
    reissue_withdrawn,
    rewind_bounded,
    rewind_groups,
)
from buffer.staleness import group_lag
from buffer.take_timeouts import batch_timeout, take_timeout
from buffer.telemetry import DROPPED_STALE
from buffer.tickets import TicketDispenser, draw_batch
from buffer.timeline import Timeline, read_timeline

log = logging.getLogger(__name__)

__all__ = ["Check", "Delivery", "RolloutConsumer", "SlotRefusedError", "TakeResult"]


class SlotRefusedError(RuntimeError):
    """A group a take needs was refused, and the refused copy is the one the buffer admitted
    under its id (`buffer.outbox` keeps an id's first push): no other copy can ever arrive."""

    def __init__(self, group_id: str, reason: str) -> None:
        super().__init__(
            f"{reason}; it is the copy the buffer admitted as {group_id!r} (an id's first push "
            "is kept, and fixed mode regenerates the same group), so its batch can never be "
            "complete"
        )
        self.group_id = group_id
        self.reason = reason


@dataclass(frozen=True)
class TakeResult:
    """Bounded mode: the groups to train, and the stale ones this call dropped (already acked;
    the learner reads them only to measure what dropping does to the trained distribution)."""

    deliveries: list[Delivery]
    dropped: list[Delivery] = field(default_factory=list)
    withdrawn: list[Delivery] = field(default_factory=list)  # made from withdrawn weights

    @property
    def dropped_stale(self) -> int:
        return len(self.dropped)


@dataclass
class _ConsumerState:
    inbox: Inbox
    stash: dict[int, dict[str, Delivery]] = field(default_factory=dict)  # fixed: batch -> group
    taken: dict[int, list[Delivery]] = field(default_factory=dict)  # fixed: returned, unsettled
    floor: int = 0  # fixed: highest batch index requested so far (draw keys: their batch)
    refused: dict[str, str] = field(default_factory=dict)  # fixed: id -> reason, admitted copy
    ready: deque[Delivery] = field(default_factory=deque)  # bounded: read, not yet returned


def create_group(client: redis.Redis, keys: RunKeys) -> None:
    """Create the stream's consumer group from id 0 (entries pushed earlier are kept); one that
    exists already is left as it is."""
    try:
        client.xgroup_create(keys.stream, keys.consumer_group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


class RolloutConsumer:
    """Takes and settles one run's groups for the learner (cheap to create; holds no thread).

    Creating one creates the stream's consumer group if it is missing; per consumer name it
    keeps what it read and has not settled (fixed mode's stash, bounded mode's read-ahead)."""

    def __init__(self, client: redis.Redis, run_id: str, config: BufferConfig | None = None):
        self._client = client
        self._keys = RunKeys(run_id)
        self._config = config or BufferConfig()
        self._tickets = TicketDispenser(client, run_id)  # extra rounds (dynamic sampling)
        self._consumers: dict[str, _ConsumerState] = {}
        create_group(client, self._keys)

    @property
    def run_id(self) -> str:
        return self._keys.run_id

    def depth(self) -> int:
        """Groups unconsumed or read-but-unacked (the stream's length)."""
        return int(self._client.xlen(self._keys.stream))

    def take_batch(
        self,
        batch_index: int,
        n_groups: int,
        consumer: str,
        timeout_s: float,
        *,
        rules: IntakeRules | None = None,
        slots: Container[str] = (),
    ) -> list[Delivery]:
        """Fixed mode: exactly the `n_groups` distinct groups of `batch_index`, by prompt index.

        A group `rules` (`buffer.intake`) refuse goes to the dead letter with the reason; they
        are checked as groups arrive, before a batch is assembled or a group counts as seen, so
        a refused group never takes a real group's place. When a refused group is the copy the
        buffer admitted under its id and that id is in `slots` (the ids the trial still needs),
        raises SlotRefusedError at once: nothing can fill that slot. Calling it again for a
        batch not yet committed returns the same deliveries (a retried step). Raises
        TimeoutError naming the batch and what arrived if it is not complete in time.
        """
        state = self._state(consumer)
        if batch_index in state.taken:
            return list(state.taken[batch_index])
        state.floor = max(state.floor, draw_batch(batch_index))
        self._drop_late(state)
        accept = None if rules is None else intake_check(rules, draw_batch(batch_index))
        check = None if accept is None else self._recording_refusals(state, accept)
        deadline = time.monotonic() + timeout_s
        while len(state.stash.get(batch_index, {})) < n_groups:
            self._raise_if_refused(state, slots)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise batch_timeout(
                    self.run_id,
                    batch_index,
                    n_groups,
                    timeout_s,
                    have=len(state.stash.get(batch_index, {})),
                    stashed=sum(len(b) for b in state.stash.values()),
                    max_depth=self._config.max_depth,
                )
            for delivery in state.inbox.fetch(n_groups, remaining, check):
                self._stash(state, delivery)
        bucket = state.stash.pop(batch_index)
        ordered = sorted(bucket.values(), key=lambda d: (d.group.prompt_index, d.group.group_id))
        chosen, extra = ordered[:n_groups], ordered[n_groups:]
        if extra:
            log.warning(
                "run %s: %d extra group(s) for batch %d dropped",
                self.run_id,
                len(extra),
                batch_index,
            )
            state.inbox.drop(extra, DROPPED_STALE)
        state.taken[batch_index] = chosen
        return list(chosen)

    def take(
        self,
        n_groups: int,
        learner_version: int,
        max_lag: int,
        consumer: str,
        timeout_s: float,
        *,
        rules: IntakeRules | None = None,
        timeline: Timeline | None = None,
    ) -> TakeResult:
        """Bounded mode: the next `n_groups` groups in arrival order with lag <= max_lag.

        Lag = learner_version - policy_version; staler groups are acked, counted in the run's
        dropped_stale counter and reported in the result; groups `rules` refuse are
        dead-lettered. Groups made from weights a rewind withdrew (`timeline`) are dropped
        before they are checked, counted as lost_to_rewind and their tickets reissued
        (`buffer.rewind.reissue_withdrawn`), before the take waits for more: their prompts may
        be the very work the generators need to make the groups it waits for (a withdrawn ticket
        counts as issued, so the admission limit can leave a generator nothing else to claim).
        On TimeoutError the groups already read are kept, in order, for the next call.
        """
        state = self._state(consumer)
        chosen: list[Delivery] = []
        stale: list[Delivery] = []
        withdrawn: list[Delivery] = []
        settled = [0, 0]  # how many of `stale`, `withdrawn` were settled already
        deadline = time.monotonic() + timeout_s
        accept = None if rules is None else intake_check(rules, learner_version)

        def settle_dropped() -> None:
            """Drop the stale groups and reissue the withdrawn ones read since the last call."""
            if len(stale) > settled[0]:
                state.inbox.drop(stale[settled[0] :], DROPPED_STALE)
                settled[0] = len(stale)
            if len(withdrawn) > settled[1]:
                reissued = withdrawn[settled[1] :]
                reissue_withdrawn(self._client, self.run_id, reissued)
                state.inbox.release([d.entry_id for d in reissued])
                settled[1] = len(withdrawn)

        def made_from_withdrawn(delivery: Delivery) -> bool:
            return timeline is not None and timeline.withdrawn(
                delivery.group.newest_token_version, delivery.timeline
            )

        def check(delivery: Delivery) -> str | None:  # a withdrawn group is no refusal
            if accept is None or made_from_withdrawn(delivery):
                return None
            return accept(delivery)

        try:
            while len(chosen) < n_groups:
                if state.ready:
                    delivery = state.ready.popleft()
                    lag = group_lag(learner_version, delivery.policy_version)
                    if made_from_withdrawn(delivery):
                        withdrawn.append(delivery)
                    else:
                        (stale if lag > max_lag else chosen).append(delivery)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise take_timeout(
                        self.run_id,
                        n_groups,
                        timeout_s,
                        have=len(chosen),
                        max_lag=max_lag,
                        learner_version=learner_version,
                    )
                settle_dropped()  # before waiting: a generator may need those prompts back
                state.ready.extend(state.inbox.fetch(n_groups - len(chosen), remaining, check))
        except BaseException:
            state.ready.extendleft(reversed(chosen))  # keep them, in order, for the next call
            raise
        finally:
            settle_dropped()
        return TakeResult(chosen, stale, withdrawn)

    def request_round(self, batch_index: int, round_index: int, prompts_per_step: int) -> int:
        """Fixed mode, dynamic sampling: ask the run's generators for extra round `round_index`
        of batch `batch_index` (`TicketDispenser.request_round`; idempotent). Its groups arrive
        under the draw key `buffer.tickets.draw_key(batch, round)` and are taken like a batch:
        `take_batch(draw_key(batch, round), prompts_per_step, ...)`."""
        return self._tickets.request_round(batch_index, round_index, prompts_per_step)

    def commit(self, deliveries: Iterable[Delivery]) -> None:
        """After the step is committed: mark the groups trained and ack them, in one MULTI."""
        deliveries = list(deliveries)
        self._settle(
            [d.entry_id for d in deliveries],
            trained_group_ids=[d.group.group_id for d in deliveries],
        )

    def committed_beyond(self, trained_group_ids: Container[str]) -> list[str]:
        """Group ids the run's Redis records as trained (committed) that `trained_group_ids`
        lacks, sorted. A resumed learner passes its checkpoint's trained ids: any id found here
        was committed after that checkpoint, so its group is gone from the buffer for good."""
        members = self._client.sscan_iter(self._keys.trained, count=1000)
        return sorted(m.decode() for m in members if m.decode() not in trained_group_ids)

    def recommit(self, trained_group_ids: Collection[str]) -> int:
        """Finish the commit a learner killed after its checkpoint did not get to: record
        `trained_group_ids` (the checkpoint's) as trained, and settle every entry still in the
        stream whose group is one of them. Returns how many entries it settled.

        Without this a resumed learner reads those entries back, as batches before the one it
        takes, and drops them as too stale (buffer/dropped_stale) although they were trained;
        regenerated copies (a ticket re-issued after an AOF lost its completion) are then
        recognised as trained duplicates too."""
        ids = list(trained_group_ids)
        pipe = self._client.pipeline(transaction=False)
        for start in range(0, len(ids), 1000):
            pipe.sadd(self._keys.trained, *ids[start : start + 1000])
        pipe.execute()
        wanted = set(ids)
        doomed: list[str] = []
        cursor = "-"
        while True:
            entries = self._client.xrange(self._keys.stream, min=cursor, count=256)
            for raw_id, fields in entries:
                if fields.get(b"group_id", b"").decode(errors="replace") in wanted:
                    doomed.append(raw_id.decode())
            if len(entries) < 256:
                break
            cursor = "(" + entries[-1][0].decode()
        self._settle(doomed)
        return len(doomed)

    def rewind(self, group_ids: Collection[str]) -> Rewound:
        """Groups committed after the checkpoint a fixed-mode learner resumes from: trainable
        again, their tickets reissued, each admitted again only as the copy that was trained
        (`buffer.rewind`)."""
        return rewind_groups(self._client, self.run_id, list(group_ids))

    def rewind_bounded(self, group_ids: Collection[str], to_version: int) -> BoundedRewind:
        """Groups committed after the checkpoint of step `to_version` a bounded-mode learner
        resumes from: fresh work again (their samples are lost); the versions after it are
        withdrawn (`buffer.rewind.rewind_bounded`)."""
        return rewind_bounded(self._client, self.run_id, to_version, list(group_ids))

    def timeline(self) -> Timeline:
        """The run's rewinds so far (`buffer.timeline`)."""
        return read_timeline(self._client, self.run_id)

    def reject(self, deliveries: Iterable[Delivery], reason: str, consumer: str) -> None:
        """Dead-letter taken deliveries that must not be trained (e.g. poison for the model)."""
        self._state(consumer).inbox.reject(list(deliveries), reason)

    def ack(self, entry_ids: Iterable[str]) -> None:
        """Ack (and delete) entries without marking them trained; prefer `commit`."""
        self._settle(list(entry_ids))

    # ---- internals ----------------------------------------------------------------------------

    def _state(self, consumer: str) -> _ConsumerState:
        if consumer not in self._consumers:
            inbox = Inbox(self._client, self._keys, consumer, self._config)
            self._consumers[consumer] = _ConsumerState(inbox)
        return self._consumers[consumer]

    def _settle(self, entry_ids: list[str], trained_group_ids: list[str] | None = None) -> None:
        settle(self._client, self._keys, entry_ids, trained_group_ids=trained_group_ids or ())
        settled = set(entry_ids)
        for state in self._consumers.values():
            state.inbox.release(entry_ids)
            for batch, taken in list(state.taken.items()):
                state.taken[batch] = [d for d in taken if d.entry_id not in settled]
                if not state.taken[batch]:
                    del state.taken[batch]
            state.ready = deque(d for d in state.ready if d.entry_id not in settled)

    def _recording_refusals(self, state: _ConsumerState, accept: Check) -> Check:
        """`accept`, also noting each refused group that is its id's admitted copy."""

        def check(delivery: Delivery) -> str | None:
            reason = accept(delivery)
            if reason is not None and self._admitted_copy(delivery):
                state.refused[delivery.group.group_id] = reason
            return reason

        return check

    def _admitted_copy(self, delivery: Delivery) -> bool:
        """Whether `delivery` is the copy the outbox admitted under its id (its digest key holds
        this group's digest): then every later push of the id is a duplicate or a conflict, and
        never added. A copy added without the outbox (no digest key, or another one) is not."""
        first = self._client.get(self._keys.digest(delivery.group.group_id))
        return first is not None and first.decode() == group_digest(
            delivery.group, delivery.batch_index
        )

    @staticmethod
    def _raise_if_refused(state: _ConsumerState, slots: Container[str]) -> None:
        for group_id, reason in state.refused.items():
            if group_id in slots:
                raise SlotRefusedError(group_id, reason)

    def _stash(self, state: _ConsumerState, delivery: Delivery) -> None:
        batch = delivery.batch_index
        if draw_batch(batch) < state.floor or batch in state.taken:
            log.warning(
                "run %s: group %s arrived for batch %d after it was taken; dropped",
                self.run_id, delivery.group.group_id, batch,
            )  # fmt: skip
            state.inbox.drop([delivery], DROPPED_STALE)
            return
        state.stash.setdefault(batch, {})[delivery.group.group_id] = delivery

    def _drop_late(self, state: _ConsumerState) -> None:
        late = [b for b in state.stash if draw_batch(b) < state.floor]
        for batch in late:
            state.inbox.drop(list(state.stash.pop(batch).values()), DROPPED_STALE)
