"""A Redis that restarts empty or dies: one line saying what to do, within seconds, never a hang.

Real redis-servers (EmbeddedRedis, so a restart keeps its port and password). "Restarts empty" is
a SIGKILL and a restart with AOF off: everything of the run is gone, the consumer group included,
and a generator starting meanwhile would wait for v0 forever. (Generators used to recreate the
group too; only the learner's consumer creates it now, and the learner fails either way.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import torch

from buffer.connection import (
    BufferConnectionError,
    RunKeys,
    RunStateLostError,
    connect,
    redis_failures_in_one_line,
)
from buffer.consumer import RolloutConsumer
from buffer.producer import RolloutProducer
from buffer.rewind import rewind_bounded
from buffer.server import EmbeddedRedis
from buffer.versions import RunStateWatch, VersionRegistry
from buffer.weight_store import WeightStore
from contract.layout import TrialPaths
from harness.trial.learner_main import require_checkpoint_version
from learner.runtime.checkpoint import CheckpointStore, TrainingState
from tests.buffer.factories import RUN_ID, fast_config, make_group

# The retries of a dead Redis take about 4.5 s (connection.RECONNECT_RETRIES); everything here must
# fail well before the timeouts a hang would run into (60 s below, 600 s in a trial).
PROMPT_S = 15.0
TO_DO = "rerun the trial without --resume"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path / "redis", appendfsync="off") as server:
        yield server


def _component(url: str) -> tuple[redis.Redis, VersionRegistry]:
    """A client and registry wired as learner_main and generator_main wire theirs."""
    watch = RunStateWatch(RUN_ID)
    client = connect(url, check_connection=watch.check_connection)
    return client, VersionRegistry(client, RUN_ID, watch=watch)


def _restart_empty(server: EmbeddedRedis) -> None:
    server.kill()  # SIGKILL, then a restart with AOF off: the run's keys are gone
    server.restart()


def _assert_one_line(message: str) -> None:
    assert "\n" not in message and TO_DO in message
    assert f"Redis lost run {RUN_ID!r}'s state" in message


def test_waiting_generator_fails_at_once_when_redis_restarts_empty(server: EmbeddedRedis) -> None:
    _, learner_versions = _component(server.url)
    for version in range(2):
        learner_versions.publish(version, f"/w/{version}")
    _, generator_versions = _component(server.url)
    assert generator_versions.current() == (1, "/w/1")
    _restart_empty(server)
    started = time.monotonic()
    with pytest.raises(RunStateLostError) as info:
        generator_versions.wait_for_version(2, timeout_s=60)  # used to wait for ever
    assert time.monotonic() - started < PROMPT_S
    _assert_one_line(str(info.value))
    assert "registry is empty, but this process already read v1" in str(info.value)


def test_learner_blocked_on_the_stream_fails_when_redis_restarts_empty(
    server: EmbeddedRedis,
) -> None:
    """As reported: Redis restarts empty and a restarted generator recreates the consumer group;
    the learner's read then found an empty group and waited out its take timeout.

    The learner reads in a thread: the server is restarted from this (main) thread because its
    PR_SET_PDEATHSIG fires when the *thread* that started it exits."""
    client, versions = _component(server.url)
    consumer = RolloutConsumer(client, RUN_ID, fast_config())
    versions.publish(0, "/w/0")
    RolloutProducer(client, RUN_ID, fast_config()).push(make_group(0), batch_index=0)
    raised: list[BaseException] = []

    def learner() -> None:
        try:
            consumer.take_batch(0, 2, consumer="learner", timeout_s=60)  # 1 of 2 groups: blocks
        except BaseException as exc:  # handed to the test thread
            raised.append(exc)

    reader = threading.Thread(target=learner)
    reader.start()
    time.sleep(0.5)  # the learner is blocked in XREADGROUP by now
    started = time.monotonic()
    _restart_empty(server)
    with connect(server.url) as other_client:  # a generator no longer does this, but even so:
        RolloutConsumer(other_client, RUN_ID, fast_config())  # XGROUP CREATE ... MKSTREAM
    reader.join(timeout=60)
    assert not reader.is_alive()
    assert time.monotonic() - started < PROMPT_S
    [error] = raised
    assert isinstance(error, RunStateLostError), repr(error)
    _assert_one_line(str(error))
    assert "registry is empty, but this process published v0" in str(error)


def test_publishing_into_an_emptied_registry_is_refused(server: EmbeddedRedis) -> None:
    client, versions = _component(server.url)
    for version in range(3):
        versions.publish(version, f"/w/{version}")
    client.flushall()  # same connection, so only the publish script can notice
    with pytest.raises(RunStateLostError, match="this process published v2"):
        versions.publish(3, "/w/3")
    assert client.get(RunKeys(RUN_ID).version) is None  # nothing written


def test_resumed_learner_requires_its_checkpoint_version(server: EmbeddedRedis) -> None:
    client, versions = _component(server.url)
    how = "the learner's checkpoint of step 4 came after v4"
    with pytest.raises(RunStateLostError, match=r"registry is empty, but the learner's checkpoint"):
        versions.require(4, how)
    _, behind = _component(server.url)
    VersionRegistry(client, RUN_ID).publish(3, "/w/3")  # AOF lost the last publish (everysec)
    with pytest.raises(RunStateLostError, match="registry is at v3, but the learner's"):
        behind.require(4, how)
    VersionRegistry(client, RUN_ID).publish(5, "/w/5")  # published ahead of the checkpoint: fine
    _, ahead = _component(server.url)
    ahead.require(4, how)
    assert ahead.current() == (5, "/w/5")


def test_a_run_not_started_yet_is_not_lost(server: EmbeddedRedis) -> None:
    """Before v0 an empty Redis is a run that has not started: no error, the usual timeout."""
    _, versions = _component(server.url)
    assert versions.current() is None
    _restart_empty(server)
    with pytest.raises(TimeoutError, match="policy version 0 was not published"):
        versions.wait_for_version(0, timeout_s=0.5)


def test_restart_with_aof_is_ridden_out(tmp_path: Path) -> None:
    """With AOF the state survives a restart: the reconnect retries hide it and nothing fails."""
    with EmbeddedRedis(tmp_path / "redis", appendfsync="always") as server:
        client, versions = _component(server.url)
        consumer = RolloutConsumer(client, RUN_ID, fast_config())
        versions.publish(0, "/w/0")
        RolloutProducer(client, RUN_ID, fast_config()).push(make_group(0), batch_index=0)
        server.kill()
        server.restart()
        assert versions.current() == (0, "/w/0")
        assert [d.group.group_id for d in consumer.take_batch(0, 1, "learner", 5)] == ["s0-b0-p0"]


def test_dead_redis_is_reported_in_one_line_after_the_retries(server: EmbeddedRedis) -> None:
    client, versions = _component(server.url)
    versions.publish(0, "/w/0")
    server.kill()
    started = time.monotonic()
    with pytest.raises(BufferConnectionError) as info, redis_failures_in_one_line(server.url):
        versions.current()
    elapsed = time.monotonic() - started
    assert 2.0 < elapsed < PROMPT_S  # retried for a few seconds (a restart would be ridden out)
    message = str(info.value)
    assert "\n" not in message and server.password not in message
    assert f"Redis at redis://:***@127.0.0.1:{server.port}/0 is gone" in message
    assert "Connection refused" in message and "--resume" in message
    client.close()


def test_resume_republishes_a_checkpoint_version_lost_with_the_last_writes(
    redis_server, tmp_path
) -> None:
    """`appendfsync everysec` may lose the last second: the registry holds v3 while the
    checkpoint is of step 4. v4's weights are on disk, so the resume republishes them; an empty
    registry is a lost run and still fails."""
    paths = TrialPaths(tmp_path / "trial")
    store = WeightStore(paths.weights)
    for version in (3, 4):
        store.write(version, {"w": torch.zeros(1)})
    CheckpointStore(paths.checkpoints).save(TrainingState(step=4), {})
    client = redis_server.client()
    registry = VersionRegistry(client, RUN_ID)
    registry.publish(3, store.path(3))
    require_checkpoint_version(VersionRegistry(client, RUN_ID), paths)
    assert registry.current() == (4, store.path(4))
    client.flushdb()
    with pytest.raises(RunStateLostError, match="registry is empty"):
        require_checkpoint_version(VersionRegistry(client, RUN_ID), paths)


def test_resume_does_not_republish_a_version_a_bounded_rewind_withdrew(
    redis_server, tmp_path
) -> None:
    """A bounded-mode learner rewound the registry from v4 to v2 (its step-4 checkpoint damaged)
    and was killed before publishing again: the registry is behind the newest checkpoint
    directory by a rewind, not by lost writes, so the next resume must not publish the
    withdrawn v4 again (generators would load it): the check reads the checkpoint the learner
    will resume from, the newest usable one."""
    paths = TrialPaths(tmp_path / "trial")
    store = WeightStore(paths.weights)
    for version in (2, 4):
        store.write(version, {"w": torch.zeros(1)})
    for step in (2, 4):
        CheckpointStore(paths.checkpoints).save(TrainingState(step=step), {})
    (paths.checkpoints / "step-000004" / "state.pt").unlink()  # the damage the rewind was for
    client = redis_server.client()
    registry = VersionRegistry(client, RUN_ID)
    for version in range(5):
        registry.publish(version, f"/weights/v{version}")
    rewind_bounded(client, RUN_ID, 2, [])
    require_checkpoint_version(VersionRegistry(client, RUN_ID), paths)
    assert registry.current() == (2, "/weights/v2")


def test_a_read_racing_this_process_own_publish_is_not_a_lost_state(
    server: EmbeddedRedis,
) -> None:
    """The learner publishes on its writer thread while its main thread reads the registry: a
    read that left before v(k) was published may come back with v(k-1) after the writer has
    recorded v(k). That is the order of events, not a Redis that lost the run (it once failed a
    trial: 'registry is at v0, but this process published v1')."""
    _, registry = _component(server.url)
    registry.publish(0, "v0")
    stop, failures = threading.Event(), []

    def read_while_publishing() -> None:
        try:
            while not stop.is_set():
                registry.latest()
        except RunStateLostError as exc:  # pragma: no cover - the bug this pins
            failures.append(exc)

    reader = threading.Thread(target=read_while_publishing)
    reader.start()
    try:
        for version in range(1, 400):
            registry.publish(version, f"v{version}")
    finally:
        stop.set()
        reader.join()
    assert failures == []
    # A registry truly behind what this process knew still fails at once.
    registry.watch.saw(1000, "this process published v1000")
    with pytest.raises(RunStateLostError, match="at v399, but this process published v1000"):
        registry.latest()
