"""Fixtures of the buffer tests: a checked client and both sides of a buffer with short timeouts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from buffer.connection import connect
from buffer.consumer import RolloutConsumer
from buffer.producer import RolloutProducer
from tests.buffer.factories import RUN_ID, fast_config
from tests.conftest import RedisInstance


@pytest.fixture
def client(redis_server: RedisInstance) -> Iterator[redis.Redis]:
    client = connect(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def producer(client: redis.Redis) -> RolloutProducer:
    """A generator's side."""
    return RolloutProducer(client, RUN_ID, fast_config())


@pytest.fixture
def consumer(client: redis.Redis) -> RolloutConsumer:
    """The learner's side (creates the consumer group)."""
    return RolloutConsumer(client, RUN_ID, fast_config())
