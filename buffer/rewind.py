"""Rewinding a run's Redis to a checkpoint: groups committed after it are made generable again.

Why. A commit deletes a trained group from the stream (design 9); a learner that must resume from
an older checkpoint than the one that committed it (the newer one damaged, or a step file it
vouched for) would wait forever for groups nobody will push again. In fixed mode everything
after a checkpoint is a deterministic function of it, so those groups can be regenerated
exactly and the lost steps replayed: `rewind_groups` undoes, per group, what its push and its
commit did, so that the run's generators make it again.

Per group id, in one Lua script (all or nothing):
- its `trained` mark is removed (the replay trains it as the first time);
- its ticket (the id's prompt index, `buffer.schema.make_group_id`) is put back as an expired
  lease owned by `rewind`, so a generator claims it before any new ticket, lowest batch first
  (`buffer.tickets`' claim order);
- its digest key, the content digest of the copy that was trained, becomes `r:<digest>`: the
  outbox admits the next push of the id only when its digest is that one (a regenerated group is
  verified against the trained one, not trusted; one made from other weights, or by a
  generator that is not deterministic after all, is a conflict, dead-lettered, and the learner's
  take fails on it at once instead of training something else).
Only ids marked trained are rewound, so it is idempotent: a second rewind of the same ids (a
learner killed during its resume, or after the generators pushed them again) changes nothing.

Bounded mode (`rewind_bounded`) cannot replay: the steps after the checkpoint are retrained on
new samples, so the groups trained after it are *lost* (their samples are gone with the commit;
the learner records them, `learner.runtime.resume`), and their tickets are reissued as fresh work
(the digest key is deleted, so the new sample of the prompt is admitted as the group). In the
same script the versions after the checkpoint are withdrawn (`buffer.timeline`): the registry
moves back, the rewind is appended to the run's timeline and announced. Groups still in the
stream that were made from withdrawn weights are dropped by the learner as it meets them
(`reissue_withdrawn`: counted, their tickets reissued). Idempotent too: the version is moved back
and the timeline lengthened only while the registry is past the checkpoint.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from buffer.connection import RunKeys
from buffer.inbox import Delivery
from buffer.telemetry import LOST_TO_REWIND

REWIND_OWNER = "rewind"
"""The owner a rewound ticket's lease names (no generator has that name)."""
REWOUND_PREFIX = "r:"
"""Prefix of a rewound id's digest key value: the digest its regenerated copy must have."""

_PROMPT_OF_ID = re.compile(r"-p(\d+)$")

# A ticket put back as an expired lease owned by `owner` (claimed before any new ticket), unless
# it is leased now; 1 if it was put back.
_LUA_REOPEN = """
local function reopen(leases, owners, ticket, owner)
  if redis.call('ZSCORE', leases, ticket) ~= false then return 0 end
  redis.call('ZADD', leases, 0, ticket)
  redis.call('HSET', owners, ticket, owner)
  return 1
end
"""

# KEYS: trained, leases, owners, then one digest key per id. ARGV: owner, then (id, ticket) pairs.
# Returns {ids unmarked as trained, tickets reopened, digests marked}.
_REWIND = (
    _LUA_REOPEN
    + """
local unmarked, reopened, marked = 0, 0, 0
for i = 2, #ARGV, 2 do
  local group_id, ticket = ARGV[i], ARGV[i + 1]
  if redis.call('SREM', KEYS[1], group_id) == 1 then
    unmarked = unmarked + 1
    local digest_key = KEYS[3 + (i / 2)]
    local first = redis.call('GET', digest_key)
    if first and string.sub(first, 1, 2) ~= 'c:' and string.sub(first, 1, 2) ~= 'r:' then
      redis.call('SET', digest_key, 'r:' .. first)
      marked = marked + 1
    end
    reopened = reopened + reopen(KEYS[2], KEYS[3], ticket, ARGV[1])
  end
end
return {unmarked, reopened, marked}
"""
)


@dataclass(frozen=True)
class Rewound:
    """What `rewind_groups` changed: counts of its three steps (ids not marked trained, e.g.
    already rewound, count in none)."""

    unmarked: int
    reopened: int
    marked: int


def ticket_of(group_id: str) -> int:
    """The ticket that makes group `group_id` (its prompt index: `s<seed>-b<batch>-p<ticket>`)."""
    match = _PROMPT_OF_ID.search(group_id)
    if match is None:
        raise ValueError(
            f"group id {group_id!r} does not end in -p<prompt index>; only ids made by "
            "buffer.schema.make_group_id can be rewound"
        )
    return int(match.group(1))


def rewind_groups(client: redis.Redis, run_id: str, group_ids: Sequence[str]) -> Rewound:
    """Make the groups `group_ids` generable and trainable again (module docstring)."""
    if not group_ids:
        return Rewound(0, 0, 0)
    keys = RunKeys(run_id)
    ids = list(dict.fromkeys(group_ids))
    argv: list[str] = [REWIND_OWNER]
    for group_id in ids:
        argv += [group_id, str(ticket_of(group_id))]
    script = client.register_script(_REWIND)
    script_keys = [keys.trained, keys.ticket_leases, keys.ticket_owners]
    script_keys += [keys.digest(group_id) for group_id in ids]
    unmarked, reopened, marked = (int(n) for n in script(keys=script_keys, args=argv))
    return Rewound(unmarked, reopened, marked)


# KEYS: trained, leases, owners, version, locations, rewinds, then one digest key per id.
# ARGV: owner, to_version, channel, then (id, ticket) pairs.
# Returns {ids unmarked, tickets reopened, the version withdrawn from (-1: none), timeline}.
_REWIND_BOUNDED = (
    _LUA_REOPEN
    + """
local unmarked, reopened = 0, 0
for i = 4, #ARGV, 2 do
  local group_id, ticket = ARGV[i], ARGV[i + 1]
  if redis.call('SREM', KEYS[1], group_id) == 1 then
    unmarked = unmarked + 1
    redis.call('DEL', KEYS[6 + (i - 2) / 2])
    reopened = reopened + reopen(KEYS[2], KEYS[3], ticket, ARGV[1])
  end
end
local to = tonumber(ARGV[2])
local current = tonumber(redis.call('GET', KEYS[4]) or '-1')
local withdrawn_from = -1
if current > to then
  redis.call('SET', KEYS[4], ARGV[2])
  for _, v in ipairs(redis.call('HKEYS', KEYS[5])) do
    if tonumber(v) > to then redis.call('HDEL', KEYS[5], v) end
  end
  redis.call('RPUSH', KEYS[6], ARGV[2] .. ':' .. current)
  redis.call('PUBLISH', ARGV[3], ARGV[2])
  withdrawn_from = current
end
return {unmarked, reopened, withdrawn_from, redis.call('LLEN', KEYS[6])}
"""
)


@dataclass(frozen=True)
class BoundedRewind:
    """What `rewind_bounded` changed: groups unmarked as trained and tickets reopened, the
    version the registry was withdrawn from (None: it was not past the checkpoint) and the
    run's timeline number after the script."""

    unmarked: int
    reopened: int
    withdrawn_from: int | None
    timeline: int


def rewind_bounded(
    client: redis.Redis, run_id: str, to_version: int, group_ids: Sequence[str]
) -> BoundedRewind:
    """Bounded mode's rewind to the checkpoint of step `to_version` (module docstring): the
    groups `group_ids` committed after it become fresh work, and the versions after it are
    withdrawn, in one script."""
    keys = RunKeys(run_id)
    ids = list(dict.fromkeys(group_ids))
    argv: list[str] = [REWIND_OWNER, str(to_version), keys.version_channel]
    for group_id in ids:
        argv += [group_id, str(ticket_of(group_id))]
    script_keys = [
        keys.trained, keys.ticket_leases, keys.ticket_owners,
        keys.version, keys.version_locations, keys.rewinds,
    ]  # fmt: skip
    script_keys += [keys.digest(group_id) for group_id in ids]
    answer = client.register_script(_REWIND_BOUNDED)(keys=script_keys, args=argv)
    unmarked, reopened, withdrawn_from, timeline = (int(n) for n in answer)
    return BoundedRewind(
        unmarked, reopened, None if withdrawn_from < 0 else withdrawn_from, timeline
    )


def reissue_withdrawn(client: redis.Redis, run_id: str, deliveries: Sequence[Delivery]) -> None:
    """Drop groups made from withdrawn weights (`buffer.timeline`) and make their prompts work
    again, in one MULTI: each entry is acked and deleted and counted as lost_to_rewind, its
    digest key deleted (the new sample of the prompt is the group from now on) and its ticket
    put back as an expired lease owned by `rewind` (claimed before any new ticket)."""
    if not deliveries:
        return
    keys = RunKeys(run_id)
    pipe = client.pipeline(transaction=True)
    entry_ids = [d.entry_id for d in deliveries]
    pipe.xack(keys.stream, keys.consumer_group, *entry_ids)
    pipe.xdel(keys.stream, *entry_ids)
    pipe.hincrby(keys.counters, LOST_TO_REWIND, len(entry_ids))
    for delivery in deliveries:
        ticket = str(ticket_of(delivery.group.group_id))
        pipe.delete(keys.digest(delivery.group.group_id))
        pipe.zadd(keys.ticket_leases, {ticket: 0}, nx=True)
        pipe.hsetnx(keys.ticket_owners, ticket, REWIND_OWNER)
    pipe.execute()
