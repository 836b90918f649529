"""Redis connections and the key layout of one run.

Every key of a run lives under `gspo:{run_id}:` so trials sharing one Redis never see each other's
data and a finished run can be removed by prefix. Clients are created with `decode_responses=False`:
payloads are Arrow bytes, and nothing received is ever unpickled or evaluated.

A broken connection is retried on a new one for a few seconds, so a Redis restart goes unnoticed;
a Redis that stays dead fails the command, and `redis_failures_in_one_line` turns that into one
line saying what to do. A Redis that comes back *empty* (restarted with AOF off, or flushed) would
look like a fresh run and hang everyone waiting on it; `connect(check_connection=...)` lets a
component refuse such a reconnect at once (versions.RunStateWatch raises RunStateLostError).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.connection import AbstractConnection
from redis.retry import Retry

_RUN_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")

DEFAULT_SOCKET_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
# A command whose connection broke is retried on a new one this many times, waiting
# min(1 s, 0.1 s * 2**attempt) in between: a Redis restart of a few seconds goes unnoticed, a dead
# Redis fails every command after about 4.5 s (measured: 4.4 s on loopback).
RECONNECT_RETRIES = 6
_RECONNECT_BACKOFF = ExponentialBackoff(cap=1.0, base=0.1)

ConnectionCheck = Callable[[AbstractConnection], None]


class BufferConnectionError(ConnectionError):
    """Redis could not be reached or refused us; the message names the URL (password hidden)."""


class RedisWritesRefusedError(BufferConnectionError):
    """Redis answers but refuses writes because it cannot write its AOF (MISCONF: a full or
    failing disk under its data directory)."""


class RunStateLostError(RuntimeError):
    """Redis no longer holds the run's state (restarted without AOF, or flushed): nothing this
    run put there (stream, tickets, trained ids, policy versions) can be trusted to exist."""


def lost_state_message(run_id: str, evidence: str) -> str:
    """The one line every component prints when it finds its run's state gone from Redis."""
    return (
        f"Redis lost run {run_id!r}'s state ({evidence}): its rollout stream, tickets and policy "
        "versions are gone, as after a Redis restart with buffer.appendfsync=off or a FLUSHALL; "
        "rerun the trial without --resume, and set buffer.appendfsync to everysec or always to "
        "make a run survive Redis restarts"
    )


def redact(url: str) -> str:
    """The URL with its password replaced by ***, safe for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def connect(
    url: str,
    tls_ca_file: str | None = None,
    *,
    socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    check_connection: ConnectionCheck | None = None,
) -> redis.Redis:
    """A checked client for `url` (redis:// or rediss://); PINGs once so a bad URL fails here.

    `socket_timeout_s` bounds every command, so it must exceed the longest server-side BLOCK we
    issue (the buffer blocks for at most 1 s per call). `tls_ca_file` has no effect on redis://.
    After the first PING a command whose connection broke is retried on a new connection
    (RECONNECT_RETRIES). `check_connection` runs on every connection the client opens, after
    the handshake: a reconnect to a Redis that restarted empty can raise there (see
    versions.RunStateWatch) instead of the component carrying on against an empty server.
    """
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss"):
        raise ValueError(
            f"buffer.redis_url {redact(url)!r} must start with redis:// or rediss:// "
            "(e.g. redis://:PASSWORD@host:6379/0)"
        )
    options: dict[str, object] = {
        "decode_responses": False,
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": connect_timeout_s,
        "health_check_interval": 30,
    }
    if scheme == "rediss" and tls_ca_file is not None:
        options["ssl_ca_certs"] = tls_ca_file
    if check_connection is not None:
        options["redis_connect_func"] = _checked_handshake(check_connection)
    client = redis.Redis.from_url(url, **options)
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        client.close()
        raise BufferConnectionError(
            f"Redis at {redact(url)} refused our credentials ({exc}); put the server's "
            "requirepass in the URL as redis://:PASSWORD@host:port/db"
        ) from exc
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        client.close()
        raise BufferConnectionError(
            f"cannot reach Redis at {redact(url)} within {connect_timeout_s} s ({exc}); check "
            "that redis-server runs there, the port, and for rediss:// the CA file"
        ) from exc
    # Retries only after the first PING, so an unreachable URL fails at once above.
    client.set_retry(
        Retry(_RECONNECT_BACKOFF, RECONNECT_RETRIES, supported_errors=(redis.ConnectionError,))
    )
    return client


def _checked_handshake(check: ConnectionCheck) -> ConnectionCheck:
    """redis-py's handshake (AUTH, SELECT) followed by `check`; a connection failing the check
    is closed, so no later command finds it open and unchecked."""

    def handshake(connection: AbstractConnection) -> None:
        connection.on_connect()
        try:
            check(connection)
        except BaseException:
            connection.disconnect()
            raise

    return handshake


@contextlib.contextmanager
def redis_failures_in_one_line(url: str) -> Iterator[None]:
    """Turn a connection that stayed broken through every retry (Redis died), a command that
    timed out, or a write Redis refused because it cannot write its AOF (MISCONF) into a
    BufferConnectionError whose one-line message says what to do."""
    try:
        yield
    except redis.ResponseError as exc:
        detail = " ".join(str(exc).split()).rstrip(".")
        if "MISCONF" not in detail and "writing to the AOF" not in detail:
            raise
        raise RedisWritesRefusedError(
            f"Redis at {redact(url)} refuses writes ({detail}); the run stopped here. Its disk is "
            "full or failing: free space where it keeps its data (the embedded one: the trial's "
            "redis/ directory) and rerun the trial with --resume"
        ) from exc
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        detail = " ".join(str(exc).split()).rstrip(".") or type(exc).__name__  # one line
        if isinstance(exc, redis.TimeoutError):
            what = f"stopped answering ({detail})"
        else:
            what = f"is gone ({detail}, still after {RECONNECT_RETRIES} reconnect attempts)"
        raise BufferConnectionError(
            f"Redis at {redact(url)} {what}; the run stopped here. Start redis-server again (the "
            "embedded one restarts with the trial) and rerun the trial with --resume: the run's "
            "state survives with buffer.appendfsync everysec or always; with off it is lost and "
            "only a fresh run works"
        ) from exc


@dataclass(frozen=True)
class RunKeys:
    """Names of every Redis key one run uses (one place, so no module invents its own)."""

    run_id: str

    def __post_init__(self) -> None:
        if not _RUN_ID.match(self.run_id):
            raise ValueError(
                f"run id {self.run_id!r} must be 1-128 characters of letters, digits, '.', '_' "
                "or '-' (it becomes part of Redis key names)"
            )

    def _key(self, name: str) -> str:
        return f"gspo:{self.run_id}:{name}"

    @property
    def prefix(self) -> str:
        """Prefix of all keys of this run (for SCAN MATCH prefix*)."""
        return self._key("")

    @property
    def stream(self) -> str:
        """Stream of rollout groups (one entry per group)."""
        return self._key("rollouts")

    @property
    def reservations(self) -> str:
        """Sorted set of push reservations (token -> expiry ms) counted against max_depth."""
        return self._key("reservations")

    consumer_group = "learner"  # the one consumer group of the rollout stream

    @property
    def dead_letter(self) -> str:
        """Stream of rejected messages with their reason."""
        return self._key("dead")

    @property
    def trained(self) -> str:
        """Set of group ids already trained (exactly-once training)."""
        return self._key("trained")

    @property
    def counters(self) -> str:
        """Hash of run counters (buffer.telemetry: dead_letter, dropped_stale, duplicate,
        conflicting_duplicate)."""
        return self._key("counters")

    def digest(self, group_id: str) -> str:
        """Content digest of the first push of group `group_id` (one key per group, so a push
        WATCHes only its own group; see buffer.outbox)."""
        return self._key(f"digest:{group_id}")

    @property
    def initial_weights(self) -> str:
        """Digest of the initial weights (v0) the learner started the run from; every generator
        compares its own model directory with it before generating."""
        return self._key("initial_weights")

    @property
    def ticket_next(self) -> str:
        """Next never-issued ticket number."""
        return self._key("tickets:next")

    @property
    def ticket_leases(self) -> str:
        """Sorted set ticket -> lease expiry (ms, Redis clock) of issued, unfinished tickets."""
        return self._key("tickets:leases")

    @property
    def ticket_owners(self) -> str:
        """Hash ticket -> generator id holding its lease."""
        return self._key("tickets:owners")

    @property
    def ticket_extra_requested(self) -> str:
        """Sorted set of extra-round tickets a learner asked for and no generator claimed yet
        (dynamic sampling, `buffer.tickets.request_round`); score = the ticket."""
        return self._key("tickets:extra:requested")

    @property
    def ticket_extra_issued(self) -> str:
        """Set of extra-round tickets ever issued: a repeated request never issues one twice."""
        return self._key("tickets:extra:issued")

    @property
    def ticket_lease_ms(self) -> str:
        """Lease length (ms) the dispenser uses; read by the push script to renew leases."""
        return self._key("tickets:lease_ms")

    @property
    def stop(self) -> str:
        """Flag asking generators to stop after their current group."""
        return self._key("stop")

    @property
    def version(self) -> str:
        """Current (latest published) policy version."""
        return self._key("version")

    @property
    def rewinds(self) -> str:
        """List of the versions bounded-mode rewinds went back to, in order (`buffer.timeline`:
        its length is the run's timeline number)."""
        return self._key("rewinds")

    @property
    def version_locations(self) -> str:
        """Hash policy version -> weight location."""
        return self._key("versions")

    @property
    def version_channel(self) -> str:
        """Pub/sub channel announcing each published version."""
        return self._key("version_notices")

    @property
    def generators(self) -> str:
        """Set of generator ids that reported telemetry."""
        return self._key("generators")

    def telemetry(self, generator_id: str) -> str:
        """Hash of one generator's counters."""
        return self._key(f"telemetry:{generator_id}")

    @property
    def eval_leases(self) -> str:
        """Sorted set of outstanding eval requests (request id -> lease expiry ms; 0 = free)."""
        return self._key("evals:leases")

    @property
    def eval_owners(self) -> str:
        """Hash of claimed eval requests -> the generator evaluating them."""
        return self._key("evals:owners")

    def eval_result(self, request_id: str) -> str:
        """List holding one eval request's JSON report, pushed by the generator that ran it."""
        return self._key(f"evals:result:{request_id}")
