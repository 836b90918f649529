"""A generator's side of one run's buffer: push groups, report figures, read the stop flag.

Pushes go through `buffer.outbox` (backpressure: a push blocks while depth >= max_depth and fails
with BufferFullError after push_timeout_s; nothing is ever trimmed). The producer creates no
consumer group: XADD creates the stream, and the learner's `RolloutConsumer` creates the group
from id 0, so groups pushed before the learner started are delivered all the same. Tickets are
claimed from `buffer.tickets.TicketDispenser`; a push completes its ticket atomically with the
entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import redis

from buffer.config import BufferConfig
from buffer.connection import RunKeys
from buffer.outbox import Outbox
from buffer.rollout_group import RolloutGroup
from buffer.run_control import stop_requested
from buffer.telemetry import Telemetry


class RolloutProducer:
    """Pushes one run's groups (cheap to create; holds no thread and no consumer state)."""

    def __init__(self, client: redis.Redis, run_id: str, config: BufferConfig | None = None):
        self._client = client
        self._keys = RunKeys(run_id)
        self._outbox = Outbox(client, self._keys, config or BufferConfig())
        self._telemetry = Telemetry(client, run_id)

    @property
    def run_id(self) -> str:
        return self._keys.run_id

    def push(self, group: RolloutGroup, batch_index: int, ticket: int | None = None) -> str:
        """Append one group; completes `ticket` atomically with it. Returns the entry id.

        Blocks with backoff while depth >= max_depth, renewing the ticket's lease meanwhile, and
        raises BufferFullError after push_timeout_s. The encoded size is checked against
        max_message_bytes (RecordError) before anything is sent.
        """
        return self._outbox.push(group, batch_index, ticket)

    def push_many(
        self,
        groups: Sequence[RolloutGroup],
        batch_index: int,
        tickets: Sequence[int | None] | None = None,
        timeline: int = 0,
    ) -> list[str]:
        """`push` of several groups of one batch in two round trips for all of them (a
        generator's round); returns each one's entry id ('' for one pushed before).

        Each group completes its own ticket atomically with its entry. Every group is encoded
        and checked before anything is sent (RecordError: none is written). `timeline`: the
        run's timeline number the generator loaded the groups' weights at (`buffer.timeline`).
        """
        tickets = [None] * len(groups) if tickets is None else tickets
        return self._outbox.push_many(groups, batch_index, tickets, timeline)

    def report_generator_stats(self, generator_id: str, figures: Mapping[str, float]) -> None:
        """A generator's perf/* figures (see Telemetry.report)."""
        self._telemetry.report(generator_id, figures)

    def stop_requested(self) -> bool:
        """Whether the run's stop flag is set (`buffer.run_control.request_stop`)."""
        return stop_requested(self._client, self.run_id)
