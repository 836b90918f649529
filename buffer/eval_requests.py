"""Eval requests: the learner asks for the evals of a published version, a generator runs them.

Why: evals run where the weights already are (the generators' engines), so no learner rank holds
a second copy of the policy (for the GSPO paper's Qwen3-30B-A3B on 8 x 80 GB that copy made the
evals the step's largest pass, 113.7 GiB per GPU by `harness plan`; peers validate through their
rollout workers too). The learner records the results; it never evaluates.

The protocol mirrors the work tickets (`buffer.tickets`): a request is a member of a sorted set
scored by its lease expiry on the Redis clock (0 = free). A generator claims the lowest version
whose lease is free or expired (one Lua script, so two generators never get one request at
once), runs the evals and pushes the report (`contract.evals.report_to_json`, JSON: nothing from
Redis is unpickled) to the request's own result list, retiring the request in the same
transaction. A generator that dies mid-eval leaves a lease that expires, or that the supervisor
releases at once (`release_owned`); another generator, or its restart, evaluates again. If the
slow original owner still finishes, its report is a second entry the learner never reads.

A request id is `<version>-<nonce>`: a learner resumed after a kill redoes its steps and asks
again under a new id, so an answer to a request of the killed learner (in bounded mode, maybe
of other weights under the same version number) is never taken for the new one. Result lists
expire after RESULT_TTL_S, so answers nobody waits for do not accumulate.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import redis

from buffer.connection import RunKeys
from buffer.tickets import DEFAULT_LEASE_S, LUA_NOW_MS
from contract.evals import EvalReport, report_from_json, report_to_json

RESULT_TTL_S = 24 * 3600
DEFAULT_WAIT_TIMEOUT_S = 600.0
WAIT_SLICE_S = 1.0  # the learner's wait re-checks `should_stop` this often

# KEYS: leases, owners. ARGV: generator, lease_ms. Returns the request id, or false.
_CLAIM = (
    LUA_NOW_MS
    + """
local now = now_ms()
local best, best_version = nil, nil
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  local version = tonumber(string.match(id, '^(%d+)-'))
  if version and (best_version == nil or version < best_version) then
    best, best_version = id, version
  end
end
if best == nil then return false end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), best)
redis.call('HSET', KEYS[2], best, ARGV[1])
return best
"""
)

# KEYS: leases, owners. ARGV: generator. Frees every lease the generator holds.
_RELEASE_OWNED = """
local released = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if redis.call('HGET', KEYS[2], id) == ARGV[1] then
    redis.call('ZADD', KEYS[1], 'XX', 0, id)
    redis.call('HDEL', KEYS[2], id)
    released = released + 1
  end
end
return released
"""


class EvalTimeoutError(TimeoutError):
    """No generator answered an eval request in time; the message says what to check."""


def request_version(request_id: str) -> int:
    """The policy version a request id names."""
    return int(request_id.split("-", 1)[0])


class EvalRequests:
    """Both sides of the eval requests of one run (module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    ):
        if lease_s <= 0 or wait_timeout_s <= 0:
            raise ValueError(
                f"eval lease_s={lease_s} and wait_timeout_s={wait_timeout_s} must be > 0 seconds"
            )
        self._wait_timeout_s = wait_timeout_s
        self._client = client
        self._keys = RunKeys(run_id)
        self._lease_ms = int(lease_s * 1000)
        self._claim = client.register_script(_CLAIM)
        self._release_owned = client.register_script(_RELEASE_OWNED)

    # --- the learner's side -----------------------------------------------------------

    def request(self, version: int) -> str:
        """Ask for the evals of published `version`; returns the request id to wait on."""
        if version < 0:
            raise ValueError(f"eval request: version {version} must be >= 0")
        request_id = f"{version}-{uuid.uuid4().hex}"
        self._client.zadd(self._keys.eval_leases, {request_id: 0})
        return request_id

    def wait(
        self, request_id: str, should_stop: Callable[[], bool] = lambda: False
    ) -> tuple[EvalReport, float]:
        """The report of `request_id` and the seconds its generator spent, once one is pushed.

        EvalTimeoutError after `wait_timeout_s` without one (no generator alive to run it);
        `should_stop()` is asked every WAIT_SLICE_S and ends the wait with that error too."""
        timeout_s = self._wait_timeout_s
        deadline = time.monotonic() + timeout_s
        key = self._keys.eval_result(request_id)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or should_stop():
                raise EvalTimeoutError(
                    f"no generator answered the eval request of policy version "
                    f"{request_version(request_id)} within {timeout_s:.0f} s (are the "
                    "trial's generators running? their logs say why not)"
                )
            popped = self._client.blpop([key], timeout=max(min(WAIT_SLICE_S, left), 0.01))
            if popped is not None:
                self._client.delete(key)  # a duplicate answer (a reclaimed request) is not read
                return _decode_answer(popped[1], request_id)

    def withdraw_all(self) -> int:
        """Drop every outstanding request: a (resumed) learner starting owns no request of an
        earlier learner process, and nobody waits for their answers. Returns how many."""
        pipe = self._client.pipeline(transaction=True)
        pipe.zcard(self._keys.eval_leases)
        pipe.delete(self._keys.eval_leases, self._keys.eval_owners)
        return int(pipe.execute()[0])

    def pending_versions(self) -> set[int]:
        """Versions with an unanswered request: the weight store must keep them."""
        ids = self._client.zrange(self._keys.eval_leases, 0, -1)
        return {request_version(raw.decode()) for raw in ids}

    # --- a generator's side -----------------------------------------------------------

    def claim(self, generator_id: str) -> str | None:
        """The free (or expired) request of the lowest version, leased to `generator_id`."""
        found = self._claim(
            keys=[self._keys.eval_leases, self._keys.eval_owners],
            args=[generator_id, self._lease_ms],
        )
        return None if found is None else found.decode()

    def answer(self, request_id: str, report: EvalReport, seconds: float) -> None:
        """Push the report of `request_id` and retire the request, in one transaction."""
        payload = b"%.6f\n" % seconds + report_to_json(report)
        key = self._keys.eval_result(request_id)
        pipe = self._client.pipeline(transaction=True)
        pipe.rpush(key, payload)
        pipe.expire(key, RESULT_TTL_S)
        pipe.zrem(self._keys.eval_leases, request_id)
        pipe.hdel(self._keys.eval_owners, request_id)
        pipe.execute()

    def release_owned(self, generator_id: str) -> int:
        """Free every request `generator_id` holds (its process died); returns how many."""
        keys = [self._keys.eval_leases, self._keys.eval_owners]
        return int(self._release_owned(keys=keys, args=[generator_id]))

    def expire_all_leases(self) -> int:
        """Free every outstanding request (a resumed trial whose generators all died)."""
        ids = self._client.zrange(self._keys.eval_leases, 0, -1)
        if ids:
            self._client.zadd(self._keys.eval_leases, dict.fromkeys(ids, 0), xx=True)
        return len(ids)


def _decode_answer(raw: bytes, request_id: str) -> tuple[EvalReport, float]:
    """(report, generator seconds) of an answer; a malformed one is a ValueError naming the
    request (the generator that wrote it runs this code, so it is a bug, not bad input)."""
    head, _, body = raw.partition(b"\n")
    try:
        seconds = float(head)
        return report_from_json(body), seconds
    except ValueError as exc:
        raise ValueError(f"eval request {request_id}: malformed answer: {exc}") from None
