"""Producer side of the buffer: reserve room, then add the group and complete its ticket at once.

Why two steps instead of one Lua script: the depth check must be atomic across producers, which
takes a script, but a ~75 KB payload passed through Lua costs Redis two to three times the XADD
itself (Lua copies and garbage-collects every argument: about 1.2 µs per KB on Redis 7.0, measured
with INFO commandstats). So a small script reserves a slot (stream length + live reservations <
max_depth), and a plain MULTI then adds the entry, drops the reservation and completes the ticket
atomically. A producer dying between the two steps leaves a reservation that expires after
RESERVATION_S: until then its slot stays unused, so the bound is never exceeded.
"""

from __future__ import annotations

import secrets
import time

import redis

from buffer.config import BufferConfig
from buffer.connection import RunKeys
from buffer.schema import RecordError, RolloutGroup, encode_group
from buffer.tickets import DEFAULT_LEASE_S, LUA_NOW_MS

RESERVATION_S = 60.0  # far longer than the one round trip between reserving and adding
_BACKOFF_START_S = 0.005
_BACKOFF_MAX_S = 0.5  # keep well under a ticket lease: every attempt renews it

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
        """Wait for room (renewing the ticket's lease), then add; returns the entry id."""
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
        token = secrets.token_hex(8)
        self._wait_for_room(group, token, ticket)
        k = self._keys
        fields = {
            "data": data, "policy_version": group.policy_version, "batch_index": batch_index,
            "group_id": group.group_id, "producer": group.generator_id,
        }  # fmt: skip
        pipe = self._client.pipeline(transaction=True)
        pipe.xadd(k.stream, fields)
        pipe.zrem(k.reservations, token)
        if ticket is not None:
            pipe.zrem(k.ticket_leases, ticket)
            pipe.hdel(k.ticket_owners, ticket)
        return pipe.execute()[0].decode()

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
