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
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from buffer.connection import RunKeys

REWIND_OWNER = "rewind"
"""The owner a rewound ticket's lease names (no generator has that name)."""
REWOUND_PREFIX = "r:"
"""Prefix of a rewound id's digest key value: the digest its regenerated copy must have."""

_PROMPT_OF_ID = re.compile(r"-p(\d+)$")

# KEYS: trained, leases, owners, then one digest key per id. ARGV: owner, then (id, ticket) pairs.
# Returns {ids unmarked as trained, tickets reopened, digests marked}.
_REWIND = """
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
    if redis.call('ZSCORE', KEYS[2], ticket) == false then
      redis.call('ZADD', KEYS[2], 0, ticket)
      redis.call('HSET', KEYS[3], ticket, ARGV[1])
      reopened = reopened + 1
    end
  end
end
return {unmarked, reopened, marked}
"""


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
