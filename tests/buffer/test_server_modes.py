"""The embedded Redis keeps its AOF (every rollout of the run) and its log private: 0600 in 0700."""

from __future__ import annotations

from pathlib import Path

from buffer.connection import connect
from buffer.server import EmbeddedRedis
from tests.buffer.file_modes import assert_private, modes_below


def test_aof_and_log_are_private(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    with EmbeddedRedis(data, appendfsync="always") as server, connect(server.url) as client:
        client.set("k", b"v")
    modes = modes_below(data)
    # Redis 7 keeps its AOF in appendonlydir/ (manifest, base and incr files) next to the log.
    assert {"appendonlydir", "appendonlydir/appendonly.aof.manifest", "redis.log"} <= set(modes)
    assert any(name.endswith(".incr.aof") for name in modes)
    assert_private(data)


def test_files_an_older_server_left_open_are_tightened(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    with EmbeddedRedis(data, appendfsync="always") as server, connect(server.url) as client:
        client.set("k", b"v")
    data.chmod(0o755)
    for path in data.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # as the server used to leave them
    with EmbeddedRedis(data, appendfsync="always") as server, connect(server.url) as client:
        assert client.get("k") == b"v"  # the same AOF was reloaded
        assert_private(data)
