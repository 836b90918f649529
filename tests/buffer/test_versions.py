"""Policy-version registry: atomic publish, lookups, and waits that wake on notice or time out."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from buffer.connection import RunKeys
from buffer.versions import VersionRegistry
from tests.buffer.factories import RUN_ID


def test_publish_current_location(client: redis.Redis) -> None:
    versions = VersionRegistry(client, RUN_ID)
    assert versions.current() is None
    versions.publish(0, "/weights/v0")
    versions.publish(1, "/weights/v1")
    assert versions.current() == (1, "/weights/v1")
    assert versions.location(0) == "/weights/v0"
    versions.publish(1, "/weights/v1")  # a resumed learner may re-publish its version
    with pytest.raises(ValueError, match="older than the current 1"):
        versions.publish(0, "/weights/v0")
    with pytest.raises(KeyError, match="no published policy version 7"):
        versions.location(7)


def test_wait_wakes_on_publish(client: redis.Redis, redis_server) -> None:
    # Polling every 30 s: only the pub/sub notice can wake the waiter within the 3 s asserted.
    versions = VersionRegistry(client, RUN_ID, poll_s=30.0)
    publisher = VersionRegistry(redis_server.client(), RUN_ID)
    publisher.publish(0, "/w/0")
    timer = threading.Timer(0.3, publisher.publish, args=(1, "/w/1"))
    start = time.monotonic()
    timer.start()
    assert versions.wait_for_version(1, timeout_s=20) == "/w/1"
    assert time.monotonic() - start < 3.0
    timer.join()


def test_wait_returns_the_requested_version_when_a_newer_one_exists(client: redis.Redis) -> None:
    versions = VersionRegistry(client, RUN_ID)
    for v in range(3):
        versions.publish(v, f"/w/{v}")
    assert versions.wait_for_version(1, timeout_s=1) == "/w/1"  # fixed mode wants exactly v1


def test_missed_notice_is_caught_by_polling(client: redis.Redis) -> None:
    versions = VersionRegistry(client, RUN_ID, poll_s=0.1)
    keys = RunKeys(RUN_ID)

    def publish_silently() -> None:  # as if the notice had been lost
        client.hset(keys.version_locations, 4, "/w/4")
        client.set(keys.version, 4)

    threading.Timer(0.2, publish_silently).start()
    assert versions.wait_for_version(4, timeout_s=5) == "/w/4"


def test_wait_times_out_cleanly(client: redis.Redis) -> None:
    versions = VersionRegistry(client, RUN_ID, poll_s=0.05)
    versions.publish(2, "/w/2")
    start = time.monotonic()
    with pytest.raises(
        TimeoutError, match=r"policy version 3 .* run-test|run 'run-test'.*version 3"
    ):
        versions.wait_for_version(3, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - start < 2.0
    assert client.pubsub_numsub(RunKeys(RUN_ID).version_channel)[0][1] == 0  # unsubscribed


def test_lost_locations_are_restored_without_moving_the_version(client: redis.Redis) -> None:
    """An AOF cut short loses the newest writes: here v1's location, v2 republished since."""
    registry = VersionRegistry(client, RUN_ID)
    registry.publish(0, "/w/v0")
    registry.publish(2, "/w/v2")
    restored = registry.restore_locations({0: "/elsewhere/v0", 1: "/w/v1", 2: "/w/v2", 3: "/w/v3"})
    assert restored == [1, 3]  # present ones are kept as they are
    assert registry.location(0) == "/w/v0" and registry.location(1) == "/w/v1"
    assert registry.current() == (2, "/w/v2")  # no version moved or announced
    assert registry.wait_for_version(1, timeout_s=1) == "/w/v1"
