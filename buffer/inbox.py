"""One named consumer's view of the rollout stream: read, check, dedupe, settle.

Reading order, each step only when the previous one found nothing:
1. the consumer's own pending entries (XREADGROUP from id 0), once after (re)start, so a learner
   restarted under the same name first gets back what it had read but not acked, including
   out-of-order groups it had stashed;
2. entries idle on other (dead) consumers for `claim_idle_ms` (XAUTOCLAIM), at most every
   claim_idle_ms / 4;
3. new entries (XREADGROUP >), blocking at most 1 s per call.

Every entry is decoded and checked; a malformed one goes to the dead-letter stream with its reason
and is acked, and so does a group the consumer's `accept` check refuses (the learner's intake,
`buffer.intake`). Only then is a group held: a group already trained (the `trained` set)
or already held under another entry id is a duplicate: acked, counted, never delivered. A refused
group is never held, so it cannot make the real group of its id look like a duplicate.
"Settling" an entry = XACK + XDEL in one MULTI, so the stream holds only unsettled groups and its
length is the buffer depth.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis

from buffer.config import BufferConfig
from buffer.connection import RunKeys, RunStateLostError, lost_state_message
from buffer.record_types import RecordError
from buffer.rollout_group import RolloutGroup
from buffer.schema import decode_group, encode_group
from buffer.telemetry import DEAD_LETTER, DUPLICATE

log = logging.getLogger(__name__)

DEAD_LETTER_PAYLOAD_BYTES = 64 * 1024  # raw payload kept per dead letter, for diagnosis
DEAD_LETTER_MAXLEN = 1000  # approximate cap; the dead_letter counter stays exact
MAX_BLOCK_MS = 1000  # well under the client's socket timeout

Entry = tuple[bytes, dict[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One group handed to the learner; ack (or commit) `entry_id` once its step is committed."""

    entry_id: str
    group: RolloutGroup
    batch_index: int
    policy_version: int
    timeline: int = 0  # the run's timeline number its generator loaded the weights at


def settle(
    client: redis.Redis,
    keys: RunKeys,
    entry_ids: Iterable[str],
    *,
    trained_group_ids: Iterable[str] = (),
    counter: str | None = None,
) -> None:
    """Atomically record trained ids, ack + delete entries, and bump a counter by their number."""
    ids = list(entry_ids)
    trained = list(trained_group_ids)
    if not ids and not trained:
        return
    pipe = client.pipeline(transaction=True)
    if trained:
        pipe.sadd(keys.trained, *trained)
    if ids:
        pipe.xack(keys.stream, keys.consumer_group, *ids)
        pipe.xdel(keys.stream, *ids)
        if counter is not None:
            pipe.hincrby(keys.counters, counter, len(ids))
    pipe.execute()


class Inbox:
    """Deliveries of one consumer name; tracks what it holds so nothing is delivered twice."""

    def __init__(self, client: redis.Redis, keys: RunKeys, consumer: str, config: BufferConfig):
        self._client = client
        self._keys = keys
        self._consumer = consumer
        self._config = config
        self._own_cursor: bytes | None = b"0-0"  # None once own pending entries were re-read
        self._claim_cursor = b"0-0"
        self._next_claim_at = 0.0
        self.held: dict[str, Delivery] = {}  # read, not yet settled
        self._held_groups: set[str] = set()

    def fetch(
        self,
        count: int,
        block_s: float,
        accept: Callable[[Delivery], str | None] | None = None,
    ) -> list[Delivery]:
        """Up to `count` fresh, checked, non-duplicate deliveries; waits at most ~`block_s`.

        `accept` (see `RolloutConsumer.take_batch`) runs on each decoded group *before* duplicate
        detection, so a refused group cannot make the real group of the same id look like a
        duplicate of it."""
        try:
            entries = self._read_own_pending(count) or self._claim_idle(count)
            if not entries:
                entries = self._read_new(count, block_s)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            raise RunStateLostError(
                lost_state_message(self._keys.run_id, "its stream or consumer group is gone")
            ) from exc
        return self._accept(entries, accept)

    def release(self, entry_ids: Iterable[str]) -> None:
        """Forget settled entries."""
        for entry_id in entry_ids:
            delivery = self.held.pop(entry_id, None)
            if delivery is not None:
                self._held_groups.discard(delivery.group.group_id)

    def drop(self, deliveries: list[Delivery], counter: str) -> None:
        """Settle deliveries that will not be trained (stale or late) and count them."""
        ids = [d.entry_id for d in deliveries]
        settle(self._client, self._keys, ids, counter=counter)
        self.release(ids)

    def reject(self, deliveries: list[Delivery], reason: str) -> None:
        """Dead-letter deliveries that decoded but must not be trained (rule or model violations),
        with the reason; the payload is the re-encoded group, so it can be inspected later."""
        for delivery in deliveries:
            producer = delivery.group.generator_id.encode()
            fields = {b"data": encode_group(delivery.group), b"producer": producer}
            self._dead_letter(delivery.entry_id, fields, reason)
        self.release([d.entry_id for d in deliveries])

    def _read_own_pending(self, count: int) -> list[Entry]:
        if self._own_cursor is None:
            return []
        entries = self._xreadgroup(self._own_cursor, count, block_ms=None)
        if entries:
            self._own_cursor = entries[-1][0]
        else:
            self._own_cursor = None
        return entries

    def _claim_idle(self, count: int) -> list[Entry]:
        now = time.monotonic()
        if now < self._next_claim_at:
            return []
        k = self._keys
        cursor, entries, *_ = self._client.xautoclaim(
            k.stream, k.consumer_group, self._consumer, self._config.claim_idle_ms,
            start_id=self._claim_cursor, count=count,
        )  # fmt: skip
        self._claim_cursor = cursor
        if cursor == b"0-0":  # scanned the whole pending list; rest a while
            self._next_claim_at = now + self._config.claim_idle_ms / 4000
        # Our own held entries come back too once idle; we already have them.
        return [e for e in entries if e[0].decode() not in self.held]

    def _read_new(self, count: int, block_s: float) -> list[Entry]:
        block_ms = min(MAX_BLOCK_MS, int(block_s * 1000))
        return self._xreadgroup(b">", count, block_ms=block_ms if block_ms > 0 else None)

    def _xreadgroup(self, start: bytes, count: int, block_ms: int | None) -> list[Entry]:
        k = self._keys
        reply = self._client.xreadgroup(
            k.consumer_group, self._consumer, {k.stream: start}, count=count, block=block_ms
        )
        return reply[0][1] if reply else []

    def _accept(
        self, entries: list[Entry], accept: Callable[[Delivery], str | None] | None
    ) -> list[Delivery]:
        fresh: list[Delivery] = []
        vanished: list[str] = []
        for raw_id, fields in entries:
            entry_id = raw_id.decode()
            if not fields:  # deleted while pending (settled elsewhere): just ack it
                vanished.append(entry_id)
                continue
            try:
                delivery = self._decode(entry_id, fields)
            except RecordError as exc:
                self._dead_letter(entry_id, fields, str(exc))
                continue
            refused = accept(delivery) if accept is not None else None
            if refused is None:
                fresh.append(delivery)
            else:
                self._dead_letter(entry_id, fields, refused)
        settle(self._client, self._keys, vanished)
        if not fresh:
            return []
        trained = self._client.smismember(self._keys.trained, [d.group.group_id for d in fresh])
        accepted, duplicates = [], []
        for delivery, was_trained in zip(fresh, trained, strict=True):
            group_id = delivery.group.group_id
            if was_trained or group_id in self._held_groups:
                duplicates.append(delivery.entry_id)
                continue
            self.held[delivery.entry_id] = delivery
            self._held_groups.add(group_id)
            accepted.append(delivery)
        if duplicates:
            log.info("run %s: %d duplicate group(s) acked", self._keys.run_id, len(duplicates))
            settle(self._client, self._keys, duplicates, counter=DUPLICATE)
        return accepted

    def _decode(self, entry_id: str, fields: dict[bytes, bytes]) -> Delivery:
        missing = [
            f for f in (b"data", b"batch_index", b"group_id", b"policy_version") if f not in fields
        ]
        if missing:
            raise RecordError(
                f"entry {entry_id} lacks fields {missing}; push with RolloutProducer.push"
            )
        try:
            batch_index = int(fields[b"batch_index"])
            header_version = int(fields[b"policy_version"])
        except ValueError:
            raise RecordError(
                f"entry {entry_id}: batch_index/policy_version are not integers"
            ) from None
        group = decode_group(
            fields[b"data"], expected_run_id=self._keys.run_id,
            max_bytes=self._config.max_message_bytes,
        )  # fmt: skip
        if fields[b"group_id"] != group.group_id.encode() or header_version != group.policy_version:
            raise RecordError(
                f"entry {entry_id}: header (group_id={fields[b'group_id']!r}, policy_version="
                f"{header_version}) disagrees with its payload ({group.group_id!r}, "
                f"{group.policy_version})"
            )
        try:
            timeline = int(fields.get(b"timeline", b"0"))
        except ValueError:
            raise RecordError(f"entry {entry_id}: timeline is not an integer") from None
        return Delivery(entry_id, group, batch_index, group.policy_version, timeline)

    def _dead_letter(self, entry_id: str, fields: dict[bytes, bytes], reason: str) -> None:
        payload = fields.get(b"data", b"")
        producer = fields.get(b"producer", b"?")
        log.warning("run %s: entry %s dead-lettered: %s", self._keys.run_id, entry_id, reason)
        k = self._keys
        pipe = self._client.pipeline(transaction=True)
        record = {
            "reason": reason.encode()[:4096],
            "producer": producer,
            "entry_id": entry_id,
            "payload_bytes": len(payload),
            "payload": payload[:DEAD_LETTER_PAYLOAD_BYTES],
        }
        pipe.xadd(k.dead_letter, record, maxlen=DEAD_LETTER_MAXLEN, approximate=True)
        pipe.xack(k.stream, k.consumer_group, entry_id)
        pipe.xdel(k.stream, entry_id)
        pipe.hincrby(k.counters, DEAD_LETTER, 1)
        pipe.execute()
