"""Policy-version registry: which weights exist, where they are, and a notice when a new one lands.

Version v = number of learner steps completed (v0 = the initial weights, published by the learner
before any generator starts). The location is opaque here (a weight-store path or URI).
Waiting uses pub/sub for a prompt wake-up plus polling as a fallback, so a notice missed during a
reconnect (pub/sub is fire-and-forget) can delay a waiter by one poll interval but never hang it.
"""

from __future__ import annotations

import time

import redis

from buffer.connection import RunKeys

# KEYS: version, locations. ARGV: version, location, channel. Refuses to move the version back.
_PUBLISH = """
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local v = tonumber(ARGV[1])
if v < current then
  return redis.error_reply('version ' .. ARGV[1] .. ' is older than the current ' .. current)
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return current
"""

DEFAULT_POLL_S = 1.0


class VersionRegistry:
    """Publish and look up policy versions of one run."""

    def __init__(self, client: redis.Redis, run_id: str, poll_s: float = DEFAULT_POLL_S):
        self._client = client
        self._keys = RunKeys(run_id)
        self._poll_s = poll_s
        self._publish = client.register_script(_PUBLISH)

    def publish(self, version: int, location: str) -> None:
        """Atomically make `version` current with its location, then announce it.

        Re-publishing the current version (a learner resuming) is allowed; going back is an error.
        """
        if version < 0:
            raise ValueError(f"policy version {version} must be >= 0")
        k = self._keys
        try:
            self._publish(
                keys=[k.version, k.version_locations], args=[version, location, k.version_channel]
            )
        except redis.ResponseError as exc:
            raise ValueError(
                f"run {k.run_id!r}: cannot publish policy version {version}: {exc}; a learner "
                "resuming from a checkpoint must publish its checkpoint's version or later"
            ) from exc

    def current(self) -> tuple[int, str] | None:
        """(latest version, its location), or None before the learner published v0."""
        raw = self._client.get(self._keys.version)
        if raw is None:
            return None
        version = int(raw)
        return version, self.location(version)

    def location(self, version: int) -> str:
        """Where the weights of `version` are; KeyError if it was never published."""
        raw = self._client.hget(self._keys.version_locations, version)
        if raw is None:
            raise KeyError(f"run {self._keys.run_id!r} has no published policy version {version}")
        return raw.decode()

    def wait_for_version(self, version: int, timeout_s: float) -> str:
        """Block until a version >= `version` is published; return the location of `version`.

        Raises TimeoutError naming the version and run if none arrives within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            # Subscribe before the first check: a publish between the two is then never missed.
            pubsub.subscribe(self._keys.version_channel)
            while True:
                latest = self.current()
                if latest is not None and latest[0] >= version:
                    return self.location(version)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                pubsub.get_message(timeout=min(self._poll_s, remaining))
        finally:
            pubsub.close()
        seen = "none" if latest is None else latest[0]
        raise TimeoutError(
            f"run {self._keys.run_id!r}: policy version {version} was not published within "
            f"{timeout_s} s (latest: {seen}); is the learner alive and stepping?"
        )
