"""Fixtures of the buffer tests: a checked client and a buffer with short timeouts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from buffer.connection import connect
from buffer.rollout_buffer import RolloutBuffer
from tests.buffer.factories import RUN_ID, fast_config
from tests.conftest import RedisInstance


@pytest.fixture
def client(redis_server: RedisInstance) -> Iterator[redis.Redis]:
    client = connect(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def buffer(client: redis.Redis) -> RolloutBuffer:
    return RolloutBuffer(client, RUN_ID, fast_config())
