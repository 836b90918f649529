"""Producer side of the buffer: claim room and the group id, then add every claimed group at once.

A push is two round trips for a whole batch of groups, however many:
1. a small Lua script per group, pipelined: it looks up the group id's digest key and, if the id
   is new, reserves a slot (stream length + live reservations < max_depth: atomic across
   producers) and claims the id (`c:<token>:<digest>`, expiring after CLAIM_S);
2. one MULTI that adds every claimed group's entry, replaces each claim by the group's content
   digest, drops the reservations and completes the tickets.
The payload never passes through Lua: a ~75 KB argument costs Redis two to three times the XADD
itself (Lua copies and garbage-collects every argument: ~110 µs per 76 KB group on Redis 7.0,
measured here with INFO cpu), while the script's arguments are a few short strings.

Each group id is added once (until `buffer.rewind` rewinds it: then once more, and only with the
digest it had). A push that finds the id's final digest equal to its own (a retried
push, or a group regenerated after a generator restart: same seeds, same weights, new
created_at) is a `duplicate`: the script counts it and completes its ticket, and nothing is sent.
One with a different digest (a forged group, or one made from other weights) is dead-lettered
with both digests, counted as `conflicting_duplicate`, and logged: the first copy stays the one
that is trained. A push that finds the id claimed by another push in flight waits for it, as it
waits for room, renewing its ticket's lease.

What the claim's expiry covers: a producer killed between its two round trips leaves a claim (and
a reservation) that block the id (and a slot) until they expire, CLAIM_S and RESERVATION_S later;
a restarted generator's push of that group waits that long, then claims it. A producer stalled
for longer than CLAIM_S between its round trips could add an id that another push claimed after
the expiry; the learner then receives the id twice and trains it once (buffer.inbox acks an id it
already holds or trained as a duplicate).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import redis

from buffer.config import BufferConfig
from buffer.connection import RunKeys
from buffer.inbox import DEAD_LETTER_MAXLEN, DEAD_LETTER_PAYLOAD_BYTES
from buffer.record_types import RecordError
from buffer.rollout_group import RolloutGroup
from buffer.schema import encode_group
from buffer.telemetry import CONFLICTING_DUPLICATE, DEAD_LETTER, DUPLICATE
from buffer.tickets import DEFAULT_LEASE_S, LUA_NOW_MS

log = logging.getLogger(__name__)

RESERVATION_S = 60.0  # far longer than the one round trip between reserving and adding
CLAIM_S = 10.0  # likewise, for the claim on a group id; short, as a restarted push waits it out
_BACKOFF_START_S = 0.005
_BACKOFF_MAX_S = 0.5  # keep well under a ticket lease: every attempt renews it

# What the claim script answers for one group.
FULL, CLAIMED, DUPLICATE_PUSH, CONFLICT, BUSY = 0, 1, 2, 3, 4

# KEYS: stream, reservations, leases, owners, lease_ms, digest key, counters.
# ARGV: max_depth, token, reservation_ms, ticket ('' = none), producer, default lease_ms, digest,
#       claim_ms, duplicate counter name.
# Returns {1} with a slot reserved and the id claimed; {2} for a duplicate (counted, ticket
# completed); {3, first digest} for a conflict (a rewound id, `r:<digest>`, is claimed like a
# new one when its digest is that one, else a conflict); {0} when full and {4} while another push
# holds the id's claim, after renewing the ticket's lease if the producer still holds it (so
# waiting never lets its ticket expire).
_CLAIM = (
    LUA_NOW_MS
    + """
local now = now_ms()
local ticket = ARGV[4]
local function renew()
  if ticket ~= '' and redis.call('HGET', KEYS[4], ticket) == ARGV[5] then
    local lease = tonumber(redis.call('GET', KEYS[5]) or ARGV[6])
    redis.call('ZADD', KEYS[3], 'XX', now + lease, ticket)
  end
end
local first = redis.call('GET', KEYS[6])
if first and string.sub(first, 1, 2) == 'r:' then
  -- rewound (buffer.rewind): admitted again only as the copy that was trained
  if string.sub(first, 3) ~= ARGV[7] then return {3, string.sub(first, 3)} end
  first = nil
end
if first then
  if string.sub(first, 1, 2) == 'c:' then
    renew()
    return {4}
  end
  if first == ARGV[7] then
    redis.call('HINCRBY', KEYS[7], ARGV[9], 1)
    if ticket ~= '' then
      redis.call('ZREM', KEYS[3], ticket)
      redis.call('HDEL', KEYS[4], ticket)
    end
    return {2}
  end
  return {3, first}
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('XLEN', KEYS[1]) + redis.call('ZCARD', KEYS[2]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
  redis.call('SET', KEYS[6], 'c:' .. ARGV[2] .. ':' .. ARGV[7], 'PX', tonumber(ARGV[8]))
  return {1}
end
renew()
return {0}
"""
)


class BufferFullError(TimeoutError):
    """The buffer stayed at max_depth for push_timeout_s; the group was not written (nor lost)."""


@dataclass
class _Push:
    """One group on its way: its bytes, digest, reservation token and ticket."""

    group: RolloutGroup
    ticket: int | None
    data: bytes
    digest: str
    token: str
    entry_id: str | None = None  # set when settled: the new entry's id, or '' (not added)


class Outbox:
    """Pushes groups of one run under the max_depth bound."""

    def __init__(self, client: redis.Redis, keys: RunKeys, config: BufferConfig):
        self._client = client
        self._keys = keys
        self._config = config
        self._claim = client.register_script(_CLAIM)

    def push(self, group: RolloutGroup, batch_index: int, ticket: int | None) -> str:
        """`push_many` of one group."""
        return self.push_many([group], batch_index, [ticket])[0]

    def push_many(
        self,
        groups: Sequence[RolloutGroup],
        batch_index: int,
        tickets: Sequence[int | None],
        timeline: int = 0,
    ) -> list[str]:
        """Push groups of one batch; returns each one's new entry id, or '' when its id was
        pushed before (a duplicate or a conflict, see the module docstring: nothing is added).
        `timeline`: the run's timeline number the generator loaded their weights at
        (`buffer.timeline`), an entry field when a rewind made it > 0.

        Every group is encoded and checked first (RecordError: nothing is sent). Then rounds of
        the two round trips until each group is settled; groups that find the buffer full or
        their id claimed wait with backoff, renewing their tickets' leases, and BufferFullError
        is raised after push_timeout_s (the groups already added stay added).
        """
        if len(groups) != len(tickets):
            raise ValueError(f"{len(groups)} groups but {len(tickets)} tickets")
        pushes = [self._prepare(g, batch_index, t) for g, t in zip(groups, tickets, strict=True)]
        deadline = time.monotonic() + self._config.push_timeout_s
        delay = _BACKOFF_START_S
        waiting = pushes
        while waiting:
            waiting = self._round(waiting, batch_index, timeline)
            if not waiting:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._full_error(waiting[0].group)
            time.sleep(min(delay, remaining))
            delay = min(2 * delay, _BACKOFF_MAX_S)
        return [p.entry_id or "" for p in pushes]

    def _prepare(self, group: RolloutGroup, batch_index: int, ticket: int | None) -> _Push:
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
        return _Push(group, ticket, data, digest, secrets.token_hex(8))

    def _round(self, pushes: list[_Push], batch_index: int, timeline: int) -> list[_Push]:
        """Claim (one pipelined round trip), then add what was claimed and dead-letter the
        conflicts (one MULTI); returns the pushes still waiting for room or a claim."""
        k = self._keys
        with self._client.pipeline(transaction=False) as pipe:
            for p in pushes:
                keys = [
                    k.stream, k.reservations, k.ticket_leases, k.ticket_owners,
                    k.ticket_lease_ms, k.digest(p.group.group_id), k.counters,
                ]  # fmt: skip
                args = [
                    self._config.max_depth, p.token, int(RESERVATION_S * 1000),
                    "" if p.ticket is None else p.ticket, p.group.generator_id,
                    int(DEFAULT_LEASE_S * 1000), p.digest, int(CLAIM_S * 1000), DUPLICATE,
                ]  # fmt: skip
                self._claim(keys=keys, args=args, client=pipe)
            answers = pipe.execute()
        claimed, conflicts, waiting = [], [], []
        for p, answer in zip(pushes, answers, strict=True):
            status = int(answer[0])
            if status == CLAIMED:
                claimed.append(p)
            elif status == DUPLICATE_PUSH:
                p.entry_id = ""
                log.info("run %s: group %s pushed again, identical: a duplicate", k.run_id,
                         p.group.group_id)  # fmt: skip
            elif status == CONFLICT:
                conflicts.append((p, answer[1].decode()))
            else:
                waiting.append(p)
        if claimed or conflicts:
            self._settle(claimed, conflicts, batch_index, timeline)
        return waiting

    def _settle(
        self,
        claimed: list[_Push],
        conflicts: list[tuple[_Push, str]],
        batch_index: int,
        timeline: int,
    ) -> None:
        """One MULTI: add the claimed groups (digest replaces claim, reservation dropped, ticket
        completed) and dead-letter the conflicting ones (ticket completed)."""
        k = self._keys
        with self._client.pipeline(transaction=True) as pipe:
            for p in claimed:
                g = p.group
                fields = {
                    "data": p.data, "policy_version": g.policy_version, "batch_index": batch_index,
                    "group_id": g.group_id, "producer": g.generator_id,
                }  # fmt: skip
                if timeline:
                    fields["timeline"] = timeline
                pipe.xadd(k.stream, fields)
                pipe.set(k.digest(g.group_id), p.digest)  # no expiry: replaces the claim's
                pipe.zrem(k.reservations, p.token)
                _complete(pipe, k, p.ticket)
            for p, first in conflicts:
                reason = conflict_reason(p.group, batch_index, p.digest, first)
                record = {
                    "reason": reason.encode()[:4096], "producer": p.group.generator_id,
                    "entry_id": "", "group_id": p.group.group_id, "digest": p.digest,
                    "first_digest": first, "payload_bytes": len(p.data),
                    "payload": p.data[:DEAD_LETTER_PAYLOAD_BYTES],
                }  # fmt: skip
                pipe.xadd(k.dead_letter, record, maxlen=DEAD_LETTER_MAXLEN, approximate=True)
                pipe.hincrby(k.counters, DEAD_LETTER, 1)
                pipe.hincrby(k.counters, CONFLICTING_DUPLICATE, 1)
                _complete(pipe, k, p.ticket)
            replies = pipe.execute()
        index = 0  # replies of each claimed push: its XADD's entry id first, then 2 + ticket's
        for p in claimed:
            p.entry_id = replies[index].decode()
            index += 3 + _ticket_commands(p.ticket)
        for p, first in conflicts:
            p.entry_id = ""
            reason = conflict_reason(p.group, batch_index, p.digest, first)
            log.warning("run %s: %s", k.run_id, reason)

    def _full_error(self, group: RolloutGroup) -> BufferFullError:
        return BufferFullError(
            f"run {self._keys.run_id!r}: buffer full (depth >= buffer.max_depth="
            f"{self._config.max_depth}) for buffer.push_timeout_s="
            f"{self._config.push_timeout_s} s; group {group.group_id!r} was not written. "
            "Is the learner alive and consuming? Otherwise raise max_depth."
        )


def _ticket_commands(ticket: int | None) -> int:
    """How many commands `_complete` queues for `ticket`."""
    return 0 if ticket is None else 2


def _complete(pipe: redis.client.Pipeline, keys: RunKeys, ticket: int | None) -> None:
    """Queue the ticket's completion: its lease and owner go (it is never reissued)."""
    if ticket is not None:
        pipe.zrem(keys.ticket_leases, ticket)
        pipe.hdel(keys.ticket_owners, ticket)


def group_digest(group: RolloutGroup, batch_index: int) -> str:
    """sha256 (hex) of what a group says, for telling a repeated push from a conflicting one.

    Covers run and group id, prompt, batch index, policy version and every sample's tokens,
    logprobs (float32 bits), reward, reward info, finish reason and routed experts. Leaves out
    created_at, generation_started_at and generator_id: a group regenerated after a generator
    restart (fixed mode: same seeds, same weights) differs only in those and is the same group.
    Every field is length-prefixed and the per-sample lengths precede the concatenated tokens,
    so no two different groups share an encoding; the arrays are hashed as one buffer each (a
    few hash updates per group, not a few per sample).
    """
    h = hashlib.sha256()

    def put(data: bytes | np.ndarray) -> None:
        h.update(struct.pack("<Q", len(data) if isinstance(data, bytes) else data.nbytes))
        h.update(data)

    put(group.run_id.encode())
    put(group.group_id.encode())
    n = len(group.response_ids)
    put(struct.pack("<qqqq", group.prompt_index, batch_index, group.policy_version, n))
    put(np.ascontiguousarray(group.prompt_ids, dtype="<i4"))
    put(np.array([len(r) for r in group.response_ids], dtype="<i8"))
    put(np.concatenate(group.response_ids).astype("<i4", copy=False))
    put(np.concatenate(group.behavior_logprobs).astype("<f4", copy=False))
    put(np.asarray(group.rewards, dtype="<f4"))  # float32, as on the wire
    for text in (*group.reward_infos, *group.finish_reasons):
        put(text.encode())
    routed = group.routed_experts
    if routed is None:
        put(b"")
    else:
        for experts in routed:
            put(struct.pack(f"<{experts.ndim}q", *experts.shape))
            put(np.ascontiguousarray(experts, dtype="<i2"))
    return h.hexdigest()


def conflict_reason(group: RolloutGroup, batch_index: int, digest: str, first: str | None) -> str:
    """The dead letter's reason for a push whose group id was first pushed with other contents."""
    return (
        f"group {group.group_id!r} (batch {batch_index}, policy v{group.policy_version}, from "
        f"{group.generator_id}) was pushed again with different contents: sha256 {digest} vs "
        f"{first} of its first push, which is kept; a forged group, or one made from other weights"
    )
