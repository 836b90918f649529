"""Work dispensing for generators: tickets with leases (admission control, design section 5).

Ticket t (0, 1, 2, ...) means prompt index t of batch t // prompts_per_step. A generator claims a
ticket, generates that group, and pushes it; the push completes the ticket atomically (see
`RolloutProducer.push`). A claim carries a lease on the Redis clock (so generator clocks never
matter); a crashed generator's ticket is handed out again once its lease expires, and the lowest
such ticket goes first so the oldest batch is never starved. If the slow original owner still
pushes, the duplicate is harmless: consumers dedupe by group id.

Admission control is the `limit` a generator passes to `claim`: a new ticket is only issued while
t < limit, so production is paced instead of generating groups that would be dropped later
(dropping and re-queueing late groups would bias training toward short responses).

Extra rounds (DAPO's dynamic sampling, fixed mode): when a batch has too few informative groups
the learner asks for round r >= 1 of batch k (`request_round`): P more tickets, numbered
r * ROUND_SPAN + k * P + slot. The round sits above bit 40 so that round 0 is exactly the
plain ticket space above (an arm without dynamic sampling issues the same tickets, prompts and
sampling seeds as before), extra tickets never collide with any batch's, and the ticket stays
the group's prompt index, so group ids, prompts and seeds remain pure functions of (seed, batch,
round, slot). Requested extra tickets are claimed before new round-0 tickets (the learner is
waiting for them) and are issued at most once, however often the learner repeats the request
(a resumed learner redoes its steps and asks again). In the buffer a round is a draw of its own
(`draw_key`), taken like a batch.
"""

from __future__ import annotations

import redis

from buffer.connection import RunKeys

DEFAULT_LEASE_S = 120.0

ROUND_SHIFT = 40
ROUND_SPAN = 1 << ROUND_SHIFT  # room for 2**40 round-0 tickets (batches x prompts per step)
MAX_EXTRA_ROUNDS = 63  # keeps every ticket below 1e14: exact in Redis Lua's doubles and strings

LUA_NOW_MS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# KEYS: next, leases, owners, lease_ms, stop, extra_requested, extra_issued.
# ARGV: generator, limit, lease_ms, round_span.
# Returns the ticket, -1 when a stop was requested, -2 when nothing may be issued yet.
# Order: an expired lease (lowest batch first), a requested extra-round ticket, a new round-0
# ticket. `limit` bounds the round-0 position (ticket mod round_span) of all three. Members stay
# the strings they were written as (a Lua number turned back into a string may not round-trip).
_CLAIM = (
    LUA_NOW_MS
    + """
if redis.call('EXISTS', KEYS[5]) == 1 then return -1 end
local now = now_ms()
local limit = tonumber(ARGV[2])
local span = tonumber(ARGV[4])
redis.call('SET', KEYS[4], ARGV[3])
local best, best_n = nil, nil
for _, t in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  local n = tonumber(t)
  if n % span < limit and (best == nil or n % span < best_n % span
      or (n % span == best_n % span and n < best_n)) then
    best, best_n = t, n
  end
end
if best == nil then
  local extra = redis.call('ZRANGE', KEYS[6], 0, 0)
  if #extra == 1 and tonumber(extra[1]) % span < limit then
    best = extra[1]
    redis.call('ZREM', KEYS[6], best)
    redis.call('SADD', KEYS[7], best)
  end
end
if best == nil then
  local nxt = tonumber(redis.call('GET', KEYS[1]) or '0')
  if nxt >= limit then return -2 end
  best = tostring(nxt)
  redis.call('SET', KEYS[1], nxt + 1)
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), best)
redis.call('HSET', KEYS[3], best, ARGV[1])
return best
"""
)

# KEYS: extra_requested, extra_issued. ARGV: tickets... Returns how many were newly requested.
_REQUEST = """
local added = 0
for i = 1, #ARGV do
  if redis.call('SISMEMBER', KEYS[2], ARGV[i]) == 0 then
    added = added + redis.call('ZADD', KEYS[1], 'NX', tonumber(ARGV[i]), ARGV[i])
  end
end
return added
"""

# KEYS: leases, owners. ARGV: generator, lease_ms, tickets... Returns how many were renewed.
_RENEW = (
    LUA_NOW_MS
    + """
local expiry = now_ms() + tonumber(ARGV[2])
local renewed = 0
for i = 3, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[1] then
    redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i])
    renewed = renewed + 1
  end
end
return renewed
"""
)

# KEYS: leases, owners. ARGV: generator. Expires every lease the generator holds; returns how many.
_RELEASE_OWNED = """
local released = 0
local owners = redis.call('HGETALL', KEYS[2])
for i = 1, #owners, 2 do
  if owners[i + 1] == ARGV[1] and redis.call('ZSCORE', KEYS[1], owners[i]) then
    redis.call('ZADD', KEYS[1], 'XX', 0, owners[i])
    released = released + 1
  end
end
return released
"""


def admission_limit(version: int, lag: int, prompts_per_step: int) -> int:
    """Tickets below this may start: (version + lag + 1) * prompts_per_step.

    Bounded mode passes the learner's version and max_lag; fixed mode passes the published version
    and its lag (batch k needs version k - lag, which exists once k <= version + lag).
    """
    if min(version, lag) < 0 or prompts_per_step <= 0:
        raise ValueError(
            f"admission_limit(version={version}, lag={lag}, prompts_per_step={prompts_per_step}): "
            "version and lag must be >= 0 and prompts_per_step > 0"
        )
    return (version + lag + 1) * prompts_per_step


def ticket_batch(ticket: int, prompts_per_step: int) -> int:
    """The batch (learner step) ticket t belongs to; t itself is the prompt index."""
    return (ticket % ROUND_SPAN) // prompts_per_step


def ticket_round(ticket: int) -> int:
    """The generation round of ticket t: 0 for every batch's own prompts, r >= 1 for the
    extra rounds dynamic sampling asks for."""
    return ticket // ROUND_SPAN


def round_tickets(batch_index: int, round_index: int, prompts_per_step: int) -> list[int]:
    """The tickets (= prompt indices) of round `round_index` of batch `batch_index`."""
    if not 0 <= round_index <= MAX_EXTRA_ROUNDS or batch_index < 0 or prompts_per_step <= 0:
        raise ValueError(
            f"round_tickets(batch={batch_index}, round={round_index}, prompts_per_step="
            f"{prompts_per_step}): need batch >= 0, 0 <= round <= {MAX_EXTRA_ROUNDS}, "
            "prompts_per_step > 0"
        )
    first = round_index * ROUND_SPAN + batch_index * prompts_per_step
    if (batch_index + 1) * prompts_per_step > ROUND_SPAN:
        raise ValueError(f"batch {batch_index} x {prompts_per_step} prompts exceeds 2**40 tickets")
    return list(range(first, first + prompts_per_step))


def draw_key(batch_index: int, round_index: int) -> int:
    """The buffer's key for one round of one batch: the batch itself for round 0, so a trial
    without extra rounds pushes and takes exactly by batch index."""
    return round_index * ROUND_SPAN + batch_index


def draw_batch(key: int) -> int:
    """The batch a draw key belongs to (what staleness and the learner's floor compare)."""
    return key % ROUND_SPAN


def draw_round(key: int) -> int:
    return key // ROUND_SPAN


def ticket_draw(ticket: int, prompts_per_step: int) -> int:
    """The draw key of ticket t: the groups a generator may make with one version and push as
    one round (`claim_batch`), and the learner takes together."""
    return draw_key(ticket_batch(ticket, prompts_per_step), ticket_round(ticket))


def fixed_policy_version(batch_index: int, lag: int, sync_every: int = 1) -> int:
    """Fixed mode: batch k is generated with exactly version max(0, k - lag), or with
    `staleness.sync_every` s > 1 the last multiple of s at or below it (generators take new
    weights only every s learner steps: deterministic, so fixed mode stays reproducible)."""
    return synced_version(max(0, batch_index - lag), sync_every)


def synced_version(version: int, sync_every: int) -> int:
    """The newest version a generator may load when weights reach it only every `sync_every`
    learner steps (TRL's and verl's sync interval): the last multiple of it <= `version`."""
    if sync_every < 1:
        raise ValueError(f"sync_every={sync_every} must be >= 1")
    return version - version % sync_every


class TicketDispenser:
    """Hands out tickets under leases; all state lives in Redis, so any process may use it."""

    def __init__(self, client: redis.Redis, run_id: str, lease_s: float = DEFAULT_LEASE_S):
        if lease_s <= 0:
            raise ValueError(f"ticket lease_s={lease_s} must be > 0 seconds")
        self._client = client
        self._keys = RunKeys(run_id)
        self._lease_ms = int(lease_s * 1000)
        self._claim = client.register_script(_CLAIM)
        self._renew = client.register_script(_RENEW)
        self._release_owned = client.register_script(_RELEASE_OWNED)
        self._request = client.register_script(_REQUEST)

    def claim(self, generator_id: str, limit: int) -> int | None:
        """The lowest expired-lease ticket below `limit`, else the next new one, else None.

        None means: nothing may start now (wait for a new policy version) or a stop was requested
        (check `buffer.run_control.stop_requested`). Atomic (one Lua script), so two generators
        never get one ticket.
        """
        k = self._keys
        keys = [
            k.ticket_next,
            k.ticket_leases,
            k.ticket_owners,
            k.ticket_lease_ms,
            k.stop,
            k.ticket_extra_requested,
            k.ticket_extra_issued,
        ]
        args = [generator_id, limit, self._lease_ms, ROUND_SPAN]
        ticket = int(self._claim(keys=keys, args=args))
        return ticket if ticket >= 0 else None

    def request_round(self, batch_index: int, round_index: int, prompts_per_step: int) -> int:
        """Ask the generators for extra round `round_index` (>= 1) of batch `batch_index`:
        its tickets are claimed before any new round-0 ticket. Idempotent: a ticket already
        requested or issued is not requested again (a resumed learner repeats its requests).
        Returns how many tickets were newly requested."""
        if round_index < 1:
            raise ValueError(f"request_round: round {round_index} must be >= 1 (0 is the batch)")
        tickets = round_tickets(batch_index, round_index, prompts_per_step)
        keys = [self._keys.ticket_extra_requested, self._keys.ticket_extra_issued]
        return int(self._request(keys=keys, args=tickets))

    def renew(self, generator_id: str, tickets: list[int]) -> int:
        """Extend the leases of `tickets` still held by `generator_id`; returns how many.

        Call it during generations longer than the lease. A push renews its own ticket while it
        waits for room, so backpressure alone never makes a ticket expire.
        """
        if not tickets:
            return 0
        keys = [self._keys.ticket_leases, self._keys.ticket_owners]
        return int(self._renew(keys=keys, args=[generator_id, self._lease_ms, *tickets]))

    def release(self, ticket: int) -> None:
        """Give a claimed ticket back undone: its lease expires now, so the next claim gets it."""
        self._client.zadd(self._keys.ticket_leases, {ticket: 0}, xx=True)

    def release_owned(self, generator_id: str) -> int:
        """Expire every lease `generator_id` holds, so its tickets are claimed again at once.

        For a generator restarted under its old id after its process died: its tickets would
        otherwise wait out the lease (DEFAULT_LEASE_S) although nobody works on them. Only the
        caller knows the previous process is dead; on a live one this merely lets a second
        generator redo its groups (a duplicate the consumers drop). Returns how many.
        """
        keys = [self._keys.ticket_leases, self._keys.ticket_owners]
        return int(self._release_owned(keys=keys, args=[generator_id]))

    def expire_all_leases(self) -> int:
        """Release every outstanding ticket (a resumed trial whose generators all died); returns
        how many."""
        leases = self._client.zrange(self._keys.ticket_leases, 0, -1)
        if leases:
            self._client.zadd(self._keys.ticket_leases, dict.fromkeys(leases, 0), xx=True)
        return len(leases)

    def all_done(self, total: int) -> bool:
        """Tickets 0..total-1 were all issued and none is still outstanding, nor any extra
        round requested. (With dynamic sampling a learner may still ask for one later: its
        generators wait for the stop request instead.)"""
        pipe = self._client.pipeline(transaction=True)
        pipe.get(self._keys.ticket_next)
        pipe.zcount(self._keys.ticket_leases, "-inf", "+inf")
        pipe.zcard(self._keys.ticket_extra_requested)
        issued, outstanding, requested = pipe.execute()
        return int(issued or 0) >= total and outstanding == 0 and requested == 0

    def complete(self, ticket: int) -> None:
        """Retire a ticket without pushing (push(..., ticket=t) already does this atomically)."""
        pipe = self._client.pipeline(transaction=True)
        pipe.zrem(self._keys.ticket_leases, ticket)
        pipe.hdel(self._keys.ticket_owners, ticket)
        pipe.execute()

    def completed(self) -> int:
        """Tickets pushed (or retired), extra rounds included: issued minus outstanding; never
        decreases."""
        pipe = self._client.pipeline(transaction=True)
        pipe.get(self._keys.ticket_next)
        pipe.scard(self._keys.ticket_extra_issued)
        pipe.zcard(self._keys.ticket_leases)
        issued, extra, outstanding = pipe.execute()
        return int(issued or 0) + int(extra) - int(outstanding)

    def issued(self) -> int:
        """Distinct tickets ever issued, i.e. groups started (re-issues are not counted twice;
        extra rounds' included)."""
        pipe = self._client.pipeline(transaction=True)
        pipe.get(self._keys.ticket_next)
        pipe.scard(self._keys.ticket_extra_issued)
        issued, extra = pipe.execute()
        return int(issued or 0) + int(extra)

    def requested_extra(self) -> list[int]:
        """Extra-round tickets requested and not yet claimed, lowest first."""
        return [int(t) for t in self._client.zrange(self._keys.ticket_extra_requested, 0, -1)]

    def outstanding(self) -> dict[int, str]:
        """Issued, unfinished tickets and the generator holding each."""
        owners = self._client.hgetall(self._keys.ticket_owners)
        return {int(t): g.decode() for t, g in owners.items()}
