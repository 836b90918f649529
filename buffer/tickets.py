"""Work dispensing for generators: tickets with leases (admission control, design section 5).

Ticket t (0, 1, 2, ...) means prompt index t of batch t // prompts_per_step. A generator claims a
ticket, generates that group, and pushes it; the push completes the ticket atomically (see
`RolloutBuffer.push`). A claim carries a lease on the Redis clock (so generator clocks never
matter); a crashed generator's ticket is handed out again once its lease expires, and the lowest
such ticket goes first so the oldest batch is never starved. If the slow original owner still
pushes, the duplicate is harmless: consumers dedupe by group id.

Admission control is the `limit` a generator passes to `claim`: a new ticket is only issued while
t < limit, so production is paced instead of generating groups that would be dropped later
(dropping and re-queueing late groups would bias training toward short responses).
"""

from __future__ import annotations

import redis

from buffer.connection import RunKeys

DEFAULT_LEASE_S = 120.0

LUA_NOW_MS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# KEYS: next, leases, owners, lease_ms, stop. ARGV: generator, limit, lease_ms.
# Returns the ticket, -1 when a stop was requested, -2 when nothing may be issued yet.
_CLAIM = (
    LUA_NOW_MS
    + """
if redis.call('EXISTS', KEYS[5]) == 1 then return -1 end
local now = now_ms()
local limit = tonumber(ARGV[2])
redis.call('SET', KEYS[4], ARGV[3])
local best = nil
for _, t in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  local n = tonumber(t)
  if n < limit and (best == nil or n < best) then best = n end
end
if best == nil then
  local nxt = tonumber(redis.call('GET', KEYS[1]) or '0')
  if nxt >= limit then return -2 end
  best = nxt
  redis.call('SET', KEYS[1], nxt + 1)
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), best)
redis.call('HSET', KEYS[3], best, ARGV[1])
return best
"""
)

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
    return ticket // prompts_per_step


def fixed_policy_version(batch_index: int, lag: int) -> int:
    """Fixed mode: batch k is generated with exactly version max(0, k - lag)."""
    return max(0, batch_index - lag)


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

    def claim(self, generator_id: str, limit: int) -> int | None:
        """The lowest expired-lease ticket below `limit`, else the next new one, else None.

        None means: nothing may start now (wait for a new policy version) or a stop was requested
        (check `stop_requested`). Atomic (one Lua script), so two generators never get one ticket.
        """
        k = self._keys
        keys = [k.ticket_next, k.ticket_leases, k.ticket_owners, k.ticket_lease_ms, k.stop]
        ticket = int(self._claim(keys=keys, args=[generator_id, limit, self._lease_ms]))
        return ticket if ticket >= 0 else None

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
        """Tickets 0..total-1 were all issued and none is still outstanding."""
        pipe = self._client.pipeline(transaction=True)
        pipe.get(self._keys.ticket_next)
        pipe.zcount(self._keys.ticket_leases, "-inf", "+inf")
        issued, outstanding = pipe.execute()
        return int(issued or 0) >= total and outstanding == 0

    def complete(self, ticket: int) -> None:
        """Retire a ticket without pushing (push(..., ticket=t) already does this atomically)."""
        pipe = self._client.pipeline(transaction=True)
        pipe.zrem(self._keys.ticket_leases, ticket)
        pipe.hdel(self._keys.ticket_owners, ticket)
        pipe.execute()

    def completed(self) -> int:
        """Tickets pushed (or retired): issued minus outstanding; never decreases."""
        pipe = self._client.pipeline(transaction=True)
        pipe.get(self._keys.ticket_next)
        pipe.zcard(self._keys.ticket_leases)
        issued, outstanding = pipe.execute()
        return int(issued or 0) - int(outstanding)

    def issued(self) -> int:
        """Distinct tickets ever issued, i.e. groups started (re-issues are not counted twice)."""
        return int(self._client.get(self._keys.ticket_next) or 0)

    def outstanding(self) -> dict[int, str]:
        """Issued, unfinished tickets and the generator holding each."""
        owners = self._client.hgetall(self._keys.ticket_owners)
        return {int(t): g.decode() for t, g in owners.items()}

    def request_stop(self) -> None:
        """Ask every generator of the run to stop: further claims return None."""
        request_stop(self._client, self._keys)

    def stop_requested(self) -> bool:
        return stop_requested(self._client, self._keys)

    def clear_stop(self) -> None:
        """Withdraw a stop request: a trial (re)starting must not inherit the last teardown's."""
        self._client.delete(self._keys.stop)


def request_stop(client: redis.Redis, keys: RunKeys) -> None:
    """Set the run's stop flag (generators finish their current group, then exit)."""
    client.set(keys.stop, b"1")


def stop_requested(client: redis.Redis, keys: RunKeys) -> bool:
    return bool(client.exists(keys.stop))
