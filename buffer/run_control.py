"""Run control: the stop flag the generators obey, and removal of a run's keys.

Plain functions of (client, run_id): each touches one key or the run's key prefix and keeps no
state, so the supervisor (a fresh trial), the watcher (teardown) and a generator's loop call them
without building a producer or a consumer (a consumer creates the stream's consumer group, which
none of them reads from). The ticket claim script reads the same flag (`RunKeys.stop`): while it
is set every claim returns None.
"""

from __future__ import annotations

import redis

from buffer.connection import RunKeys


def request_stop(client: redis.Redis, run_id: str) -> None:
    """Set the run's stop flag (generators finish their current group, then exit)."""
    client.set(RunKeys(run_id).stop, b"1")


def stop_requested(client: redis.Redis, run_id: str) -> bool:
    """Whether the run's stop flag is set."""
    return bool(client.exists(RunKeys(run_id).stop))


def clear_stop(client: redis.Redis, run_id: str) -> None:
    """Withdraw a stop request: a trial (re)starting must not inherit the last teardown's."""
    client.delete(RunKeys(run_id).stop)


def delete_run(client: redis.Redis, run_id: str) -> int:
    """Remove every key of one run (a fresh trial reusing a run id); returns how many.

    The stream and its consumer group go too; the learner's consumer creates them again."""
    prefix = RunKeys(run_id).prefix
    doomed = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for start in range(0, len(doomed), 1000):
        client.unlink(*doomed[start : start + 1000])
    return len(doomed)
