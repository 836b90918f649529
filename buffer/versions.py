"""Policy-version registry: which weights exist, where they are, and a notice when a new one lands.

Version v = number of learner steps completed (v0 = the initial weights, published by the learner
before any generator starts). The location is opaque here (a weight-store path or URI).
Waiting uses pub/sub for a prompt wake-up plus polling as a fallback, so a notice missed during a
reconnect (pub/sub is fire-and-forget) can delay a waiter by one poll interval but never hang it.

The registry also witnesses that Redis still holds the run: v0 is published before anything else
of the run is used and the version moves back only by a bounded-mode rewind, which lengthens the
run's timeline (`buffer.timeline`) in the same script; so a registry found empty, or behind a
version this process already saw with no rewind since, means Redis lost the run's state
(RunStateWatch).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import redis
from redis.connection import AbstractConnection

from buffer.connection import RunKeys, RunStateLostError, lost_state_message
from buffer.timeline import Timeline, read_timeline

# KEYS: version, locations. ARGV: version, location, channel, known (-1: none).
# Refuses to move the version back, and to publish into a registry behind what the publisher
# already knows (Redis lost the run's state: publishing would paper over it).
_PUBLISH = """
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
if current < tonumber(ARGV[4]) then
  return redis.error_reply('RUNSTATELOST ' .. current)
end
local v = tonumber(ARGV[1])
if v < current then
  return redis.error_reply('version ' .. ARGV[1] .. ' is older than the current ' .. current)
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return current
"""
_LOST = "RUNSTATELOST"

DEFAULT_POLL_S = 1.0


@dataclass(frozen=True)
class Known:
    """What a process knew of the registry at one moment: the version (None: nothing yet), the
    run's timeline number then, and how it learnt the version (for the error message)."""

    version: int | None
    timeline: int
    how: str


class RunStateWatch:
    """The newest policy version this process knows Redis holds for one run, and the check that
    Redis still holds it.

    VersionRegistry feeds it every version it publishes or reads. Installed on a client with
    `connect(check_connection=watch.check_connection)`, it also checks every new connection, so a
    Redis that restarted empty fails the reconnect that follows the restart, whatever the component
    was doing (a learner blocked on the stream, a generator waiting for a version), instead of the
    component waiting forever on a recreated, empty consumer group or registry.

    Threads share it (the learner publishes on its writer thread while its main thread reads),
    so a read is checked against what was known when it *began* (`snapshot`): a version this
    process published while the read was in flight is no evidence against what the read saw.
    """

    def __init__(self, run_id: str):
        self._keys = RunKeys(run_id)
        self._lock = threading.Lock()
        self.known: int | None = None
        self.known_timeline = 0  # the run's timeline number when `known` was seen
        self._how = ""  # how `known` became known, for the error message

    def snapshot(self) -> Known:
        """What is known now: take it before a read, check the read against it."""
        with self._lock:
            return Known(self.known, self.known_timeline, self._how)

    def saw(self, version: int, how: str) -> None:
        """Record that Redis held `version` (`how` completes "the registry is empty, but ...")."""
        with self._lock:
            if self.known is None or version > self.known:
                self.known, self._how = version, how

    def rewound(self, version: int, timeline: int, how: str) -> None:
        """A rewind (timeline number `timeline`) moved the registry back to `version`: what this
        process saw before it is no evidence of a lost state any more."""
        with self._lock:
            self._rewound(version, timeline, how)

    def _rewound(self, version: int, timeline: int, how: str) -> None:
        if timeline > self.known_timeline:
            self.known, self.known_timeline, self._how = version, timeline, how

    def check(
        self, found: int | None, timeline: int | None = None, before: Known | None = None
    ) -> None:
        """RunStateLostError if the registry's version `found` (None: empty) is behind what was
        known `before` the read began (default: what is known now), unless the run's timeline
        number `timeline` says a rewind happened since (then the rewound version is what is
        known from now on)."""
        with self._lock:
            if found is not None and timeline is not None and timeline > self.known_timeline:
                self._rewound(found, timeline, f"this process already read v{found} after a rewind")
                return
            basis = before or Known(self.known, self.known_timeline, self._how)
        if basis.version is None or (found is not None and found >= basis.version):
            return
        registry = "empty" if found is None else f"at v{found}"
        raise RunStateLostError(
            lost_state_message(
                self._keys.run_id, f"its policy-version registry is {registry}, but {basis.how}"
            )
        )

    def check_connection(self, connection: AbstractConnection) -> None:
        """For connect(check_connection=...): read the registry on a fresh connection."""
        before = self.snapshot()
        if before.version is None:
            return  # nothing known yet: an empty Redis is a run that has not started
        connection.send_command("GET", self._keys.version)
        connection.send_command("LLEN", self._keys.rewinds)
        raw, timeline = connection.read_response(), connection.read_response()
        self.check(None if raw is None else int(raw), int(timeline), before)


class InitialWeightsMismatchError(RuntimeError):
    """A component's initial weights differ from the ones the run started from."""


class VersionRegistry:
    """Publish and look up policy versions of one run."""

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        poll_s: float = DEFAULT_POLL_S,
        watch: RunStateWatch | None = None,
    ):
        self._client = client
        self._keys = RunKeys(run_id)
        self._poll_s = poll_s
        self._publish = client.register_script(_PUBLISH)
        # Share the watch given to connect() so both see the same versions.
        self.watch = watch if watch is not None else RunStateWatch(run_id)

    def require(self, version: int, how: str) -> None:
        """Fail at once (RunStateLostError) unless Redis holds `version` or later, e.g. a learner
        resuming from the checkpoint of step k, which was saved after publishing vk."""
        self.watch.saw(version, how)
        self._read_version()

    def publish(self, version: int, location: str) -> None:
        """Atomically make `version` current with its location, then announce it.

        Re-publishing the current version (a learner resuming) is allowed; going back is an error.
        """
        if version < 0:
            raise ValueError(f"policy version {version} must be >= 0")
        k = self._keys
        before = self.watch.snapshot()
        known = -1 if before.version is None else before.version
        try:
            self._publish(
                keys=[k.version, k.version_locations],
                args=[version, location, k.version_channel, known],
            )
        except redis.ResponseError as exc:
            if str(exc).startswith(_LOST):
                found = int(str(exc).split()[1])
                self.watch.check(None if found < 0 else found, before=before)
            raise ValueError(
                f"run {k.run_id!r}: cannot publish policy version {version}: {exc}; a learner "
                "resuming from a checkpoint must publish its checkpoint's version or later"
            ) from exc
        self.watch.saw(version, f"this process published v{version}")

    def restore_locations(self, locations: dict[int, str]) -> list[int]:
        """Name the location of each version in `locations` the registry lacks, without moving
        the current version or announcing anything; returns the versions restored.

        For a resumed learner: an AOF truncated by a crash (Redis loads it, aof-load-truncated)
        keeps the registry's older writes and loses the newest, so a version a generator still
        needs may have lost its location while its weights are still in the weight store.
        """
        if not locations:
            return []
        pipe = self._client.pipeline(transaction=True)
        for version, location in sorted(locations.items()):
            pipe.hsetnx(self._keys.version_locations, version, location)
        added = pipe.execute()
        return [v for v, new in zip(sorted(locations), added, strict=True) if new]

    def record_initial_weights(self, digest: str, who: str) -> None:
        """The learner names the initial weights (v0) of the run, before it publishes v0. A
        resumed learner must name the same ones: InitialWeightsMismatchError otherwise."""
        if not self._client.set(self._keys.initial_weights, digest, nx=True):
            self.check_initial_weights(digest, who)

    def initial_weights_named(self) -> str | None:
        """The digest the learner named, or None before it did."""
        raw = self._client.get(self._keys.initial_weights)
        return None if raw is None else raw.decode()

    def check_initial_weights(self, digest: str, who: str) -> None:
        """InitialWeightsMismatchError unless `digest` (sha256 of `who`'s initial weights) is the
        run's. A generator starts on its own copy of the model (v0 is never loaded from the weight
        store), so a node that built or mounted a different model would sample from another
        policy than the learner scores, silently: every ratio and correction would be wrong."""
        expected = self.initial_weights_named()
        if expected is None:
            return  # a learner of an older version, or none yet: nothing to compare with
        if expected != digest:
            raise InitialWeightsMismatchError(
                f"{who} has initial weights with sha256 {digest[:12]}..., but run "
                f"{self._keys.run_id!r} started from {expected[:12]}...: every node must load the "
                "same model (mount model.path, or model.cache_dir for the built-in model, on "
                "storage all nodes share; a model built separately on another CPU differs)"
            )

    def current(self) -> tuple[int, str] | None:
        """(latest version, its location), or None before the learner published v0.

        RunStateLostError if the registry is empty or behind a version this process already saw.
        """
        found = self.latest()
        return None if found is None else (found, self.location(found))

    def latest(self) -> int | None:
        """The latest published version (one GET, no location), None before v0; RunStateLostError
        as `current`."""
        found = self._read_version()
        if found is not None:
            self.watch.saw(found, f"this process already read v{found}")
        return found

    def _read_version(self) -> int | None:
        """The registry's version, checked against the watch with the run's timeline number
        (read in the same round trip: a rewind moves both in one script)."""
        before = self.watch.snapshot()  # a version published while the read is out: no evidence
        pipe = self._client.pipeline(transaction=True)
        pipe.get(self._keys.version)
        pipe.llen(self._keys.rewinds)
        raw, timeline = pipe.execute()
        found = None if raw is None else int(raw)
        self.watch.check(found, int(timeline), before)
        return found

    def timeline(self) -> Timeline:
        """The run's rewinds so far (`buffer.timeline`; one LRANGE)."""
        return read_timeline(self._client, self._keys.run_id)

    def rewound(self, version: int, timeline: int) -> None:
        """This process rewound the registry to `version` (timeline number `timeline`): it may
        publish the versions after it again (`buffer.rewind.rewind_bounded`)."""
        self.watch.rewound(version, timeline, f"this process rewound the registry to v{version}")

    def announcements(self) -> VersionAnnouncements:
        """A subscription to this run's version announcements (`VersionAnnouncements`)."""
        return VersionAnnouncements(self._client, self._keys.version_channel)

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


class VersionAnnouncements:
    """The versions `VersionRegistry.publish` announces on the run's channel, read without a
    round trip: `newest()` drains what has arrived on the subscription's socket (a non-blocking
    poll, microseconds) and returns the largest version announced since the last call.

    Why: a partial-rollout generator asks "is there a newer version?" every decoded token or
    few (`harness.trial.weight_updates`); two Redis round trips per ask cost a quarter of its
    tokens/s on the tiny model. Pub/sub delivers at most once (a reconnect can lose a message),
    so a reader still reads the registry itself now and then; announcements only make the
    common "nothing new" answer free. Subscribe before the first read of the registry, so that
    nothing published between the two is missed.
    """

    def __init__(self, client: redis.Redis, channel: str) -> None:
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(channel)

    def newest(self) -> int | None:
        """The largest version announced since the last call, None when none was."""
        newest = None
        while (message := self._pubsub.get_message(timeout=0.0)) is not None:
            if message.get("type") == "message":
                version = int(message["data"])
                newest = version if newest is None else max(newest, version)
        return newest

    def close(self) -> None:
        self._pubsub.close()
