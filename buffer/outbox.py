"""Producer side of the buffer: reserve room, then add the group and complete its ticket at once.

Why two steps instead of one Lua script: the depth check must be atomic across producers, which
takes a script, but a ~75 KB payload passed through Lua costs Redis two to three times the XADD
itself (Lua copies and garbage-collects every argument: about 1.2 µs per KB on Redis 7.0, measured
with INFO commandstats). So a small script reserves a slot (stream length + live reservations <
max_depth), and a plain MULTI then adds the entry, drops the reservation and completes the ticket
atomically. A producer dying between the two steps leaves a reservation that expires after
RESERVATION_S: until then its slot stays unused, so the bound is never exceeded.

Each group id is added once. The first push stores a digest of the group's contents (`digest`:
tokens, logprobs, rewards, versions and indices, not its timestamps nor which generator made it)
under the group's own key; that MULTI WATCHes the key, so of two pushes of one id exactly one adds
the entry. A later push with the same digest (a retried push, or a group regenerated after a
generator restart: same seeds, same weights, new created_at) is counted as a `duplicate` and adds
nothing. One with a different digest (a forged group, or one made from other weights) is
dead-lettered with both digests, counted as `conflicting_duplicate`, and logged: the first copy
stays the one that is trained. Either way the pusher's ticket is completed, so it is not reissued.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import struct
import time

import numpy as np
import redis

from buffer.config import BufferConfig
from buffer.connection import RunKeys
from buffer.inbox import DEAD_LETTER_MAXLEN, DEAD_LETTER_PAYLOAD_BYTES
from buffer.schema import RecordError, RolloutGroup, encode_group
from buffer.telemetry import CONFLICTING_DUPLICATE, DEAD_LETTER, DUPLICATE
from buffer.tickets import DEFAULT_LEASE_S, LUA_NOW_MS

log = logging.getLogger(__name__)

RESERVATION_S = 60.0  # far longer than the one round trip between reserving and adding
_BACKOFF_START_S = 0.005
_BACKOFF_MAX_S = 0.5  # keep well under a ticket lease: every attempt renews it
_ADD_ATTEMPTS = 20  # WATCH conflicts need another push of the same group id in between

# KEYS: stream, reservations, leases, owners, lease_ms.
# ARGV: max_depth, token, reservation_ms, ticket ('' = none), producer, default lease_ms.
# Returns 1 with a slot reserved; 0 when full, after renewing the ticket's lease if the producer
# still holds it (so waiting on backpressure never lets its ticket expire).
_RESERVE = (
    LUA_NOW_MS
    + """
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('XLEN', KEYS[1]) + redis.call('ZCARD', KEYS[2]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
  return 1
end
local ticket = ARGV[4]
if ticket ~= '' and redis.call('HGET', KEYS[4], ticket) == ARGV[5] then
  local lease = tonumber(redis.call('GET', KEYS[5]) or ARGV[6])
  redis.call('ZADD', KEYS[3], 'XX', now + lease, ticket)
end
return 0
"""
)


class BufferFullError(TimeoutError):
    """The buffer stayed at max_depth for push_timeout_s; the group was not written (nor lost)."""


class Outbox:
    """Pushes groups of one run under the max_depth bound."""

    def __init__(self, client: redis.Redis, keys: RunKeys, config: BufferConfig):
        self._client = client
        self._keys = keys
        self._config = config
        self._reserve = client.register_script(_RESERVE)

    def push(self, group: RolloutGroup, batch_index: int, ticket: int | None) -> str:
        """Wait for room (renewing the ticket's lease), then add; returns the new entry's id, or
        '' when the group id was pushed before (see the module docstring: nothing is added)."""
        if group.run_id != self._keys.run_id:
            raise RecordError(
                f"group {group.group_id!r} is for run {group.run_id!r}, not {self._keys.run_id!r}"
            )
        data = encode_group(group)
        limit = self._config.max_message_bytes
        if len(data) > limit:
            raise RecordError(
                f"group {group.group_id!r} encodes to {len(data)} bytes, over "
                f"buffer.max_message_bytes={limit}; shorten responses or raise the limit"
            )
        digest = group_digest(group, batch_index)
        token = secrets.token_hex(8)
        self._wait_for_room(group, token, ticket)
        for _ in range(_ADD_ATTEMPTS):
            try:
                return self._add(
                    group, batch_index, ticket=ticket, data=data, digest=digest, token=token
                )
            except redis.WatchError:
                continue  # another push of this group id landed in between: look again
        raise RuntimeError(
            f"run {self._keys.run_id!r}: group {group.group_id!r} could not be added in "
            f"{_ADD_ATTEMPTS} attempts: its digest key kept changing (pushes of one id racing)"
        )

    def _add(
        self, group: RolloutGroup, batch_index: int, *, ticket: int | None, data: bytes,
        digest: str, token: str,
    ) -> str:  # fmt: skip
        """One WATCH/MULTI round: add the group, or count it as a duplicate, or dead-letter it,
        and in the same MULTI drop the reservation and complete the ticket."""
        k = self._keys
        digest_key = k.digest(group.group_id)
        with self._client.pipeline(transaction=True) as pipe:
            pipe.watch(digest_key)
            raw = pipe.get(digest_key)
            first = None if raw is None else raw.decode()
            conflict = first not in (None, digest)
            reason = conflict_reason(group, batch_index, digest, first) if conflict else ""
            pipe.multi()
            if first is None:
                fields = {
                    "data": data, "policy_version": group.policy_version,
                    "batch_index": batch_index, "group_id": group.group_id,
                    "producer": group.generator_id,
                }  # fmt: skip
                pipe.xadd(k.stream, fields)
                pipe.set(digest_key, digest)
            elif first == digest:
                pipe.hincrby(k.counters, DUPLICATE, 1)
            else:
                record = {
                    "reason": reason.encode()[:4096], "producer": group.generator_id,
                    "entry_id": "", "group_id": group.group_id, "digest": digest,
                    "first_digest": first, "payload_bytes": len(data),
                    "payload": data[:DEAD_LETTER_PAYLOAD_BYTES],
                }  # fmt: skip
                pipe.xadd(k.dead_letter, record, maxlen=DEAD_LETTER_MAXLEN, approximate=True)
                pipe.hincrby(k.counters, DEAD_LETTER, 1)
                pipe.hincrby(k.counters, CONFLICTING_DUPLICATE, 1)
            pipe.zrem(k.reservations, token)
            if ticket is not None:
                pipe.zrem(k.ticket_leases, ticket)
                pipe.hdel(k.ticket_owners, ticket)
            replies = pipe.execute()
        if first is None:
            return replies[0].decode()
        if conflict:
            log.warning("run %s: %s", k.run_id, reason)
        else:
            log.info(
                "run %s: group %s pushed again, identical: a duplicate", k.run_id, group.group_id
            )
        return ""

    def _wait_for_room(self, group: RolloutGroup, token: str, ticket: int | None) -> None:
        k = self._keys
        keys = [k.stream, k.reservations, k.ticket_leases, k.ticket_owners, k.ticket_lease_ms]
        args = [
            self._config.max_depth, token, int(RESERVATION_S * 1000),
            "" if ticket is None else ticket, group.generator_id, int(DEFAULT_LEASE_S * 1000),
        ]  # fmt: skip
        deadline = time.monotonic() + self._config.push_timeout_s
        delay = _BACKOFF_START_S
        while not self._reserve(keys=keys, args=args):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BufferFullError(
                    f"run {k.run_id!r}: buffer full (depth >= buffer.max_depth="
                    f"{self._config.max_depth}) for buffer.push_timeout_s="
                    f"{self._config.push_timeout_s} s; group {group.group_id!r} was not written. "
                    "Is the learner alive and consuming? Otherwise raise max_depth."
                )
            time.sleep(min(delay, remaining))
            delay = min(2 * delay, _BACKOFF_MAX_S)


def group_digest(group: RolloutGroup, batch_index: int) -> str:
    """sha256 (hex) of what a group says, for telling a repeated push from a conflicting one.

    Covers run and group id, prompt, batch index, policy version and every sample's tokens,
    logprobs (float32 bits), reward, reward info, finish reason and routed experts. Leaves out
    created_at, generation_started_at and generator_id: a group regenerated after a generator
    restart (fixed mode: same seeds, same weights) differs only in those and is the same group.
    Every field is length-prefixed, so no two different groups share an encoding.
    """
    h = hashlib.sha256()

    def put(data: bytes) -> None:
        h.update(struct.pack("<Q", len(data)))
        h.update(data)

    put(group.run_id.encode())
    put(group.group_id.encode())
    put(
        struct.pack(
            "<qqqq", group.prompt_index, batch_index, group.policy_version, len(group.response_ids)
        )
    )
    put(np.asarray(group.prompt_ids, dtype="<i4").tobytes())
    routed = group.routed_experts
    for i, response in enumerate(group.response_ids):
        put(np.asarray(response, dtype="<i4").tobytes())
        put(np.asarray(group.behavior_logprobs[i], dtype="<f4").tobytes())
        put(struct.pack("<f", group.rewards[i]))  # float32, as on the wire
        put(group.reward_infos[i].encode())
        put(group.finish_reasons[i].encode())
        if routed is None:
            put(b"")
        else:
            experts = np.asarray(routed[i], dtype="<i2")
            put(struct.pack(f"<{experts.ndim}q", *experts.shape) + experts.tobytes())
    return h.hexdigest()


def conflict_reason(group: RolloutGroup, batch_index: int, digest: str, first: str | None) -> str:
    """The dead letter's reason for a push whose group id was first pushed with other contents."""
    return (
        f"group {group.group_id!r} (batch {batch_index}, policy v{group.policy_version}, from "
        f"{group.generator_id}) was pushed again with different contents: sha256 {digest} vs "
        f"{first} of its first push, which is kept; a forged group, or one made from other weights"
    )
