"""EmbeddedRedis: loopback, password required, AOF as asked, stopped cleanly, never orphaned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from buffer.connection import connect
from buffer.server import EmbeddedRedis, RedisStartError

REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def _wait_dead(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _config(client: redis.Redis) -> dict[str, str]:
    """CONFIG GET * as str -> str (redis-py returns str or bytes depending on version)."""
    as_str = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
    return {as_str(k): as_str(v) for k, v in client.config_get("*").items()}


def test_refuses_clients_without_the_password(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path, appendfsync="always") as server:
        for password in (None, "guess"):
            stranger = redis.Redis(
                host="127.0.0.1", port=server.port, password=password, retry=Retry(NoBackoff(), 0)
            )
            with pytest.raises(redis.AuthenticationError):
                stranger.ping()
        client = connect(server.url)
        assert client.ping()
        config = _config(client)
        assert config["bind"].startswith("127.0.0.1")
        assert config["appendonly"] == "yes" and config["appendfsync"] == "always"
        assert config["save"] == ""
        assert config["dir"] == str(tmp_path.resolve())
        # The password never appears on the command line (visible to every local user).
        cmdline = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        assert server.password.encode() not in cmdline


def test_appendfsync_off_disables_the_aof(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path, appendfsync="off") as server:
        assert _config(connect(server.url))["appendonly"] == "no"


def test_stop_is_clean_and_idempotent(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path)
    with server:
        pid = server.process.pid
    assert server.process is None and _wait_dead(pid)
    server.stop()  # a second stop is a no-op


def test_restart_keeps_port_password_and_data(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path, appendfsync="always") as server:
        url = server.url
        connect(url).set("k", "v")
        server.restart()
        assert server.url == url
        assert connect(url).get("k") == b"v"


def test_dies_with_its_parent(tmp_path: Path) -> None:
    # A parent killed with SIGKILL runs no cleanup; PR_SET_PDEATHSIG must still end redis-server.
    script = textwrap.dedent(f"""
        import sys, time
        from buffer.server import EmbeddedRedis
        server = EmbeddedRedis({str(tmp_path)!r})
        server.start()
        print(server.process.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE)
    try:
        redis_pid = int(parent.stdout.readline())
        assert _alive(redis_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert _wait_dead(redis_pid), f"redis-server {redis_pid} outlived its parent"
    finally:
        parent.kill()
        parent.wait()


def test_missing_binary_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="install Debian's redis-server"):
        EmbeddedRedis(tmp_path).start()


def test_bad_appendfsync_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="appendfsync"):
        EmbeddedRedis(tmp_path, appendfsync="sometimes")  # type: ignore[arg-type]


def test_url_before_start_explains(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="not been started"):
        _ = EmbeddedRedis(tmp_path).url


def _incr_aof(data_dir: Path) -> Path:
    [aof] = (data_dir / "appendonlydir").glob("*.incr.aof")
    return aof


def test_an_aof_it_cannot_load_fails_the_start_in_one_line(tmp_path: Path) -> None:
    """It used to retry three ports, then raise 'did not answer' with the log's last 20 lines."""
    with EmbeddedRedis(tmp_path, appendfsync="always") as server:
        connect(server.url).set("k", "v")
    with _incr_aof(tmp_path).open("ab") as aof:
        aof.write(b"garbage\x00\xff not a command\r\n")
    started = time.monotonic()
    with pytest.raises(RedisStartError) as raised:
        EmbeddedRedis(tmp_path).start()
    assert time.monotonic() - started < 5  # no wait for an answer from a server that exited
    message = str(raised.value)
    assert "\n" not in message
    assert "Bad file format reading the append only file" in message
    assert f"redis-check-aof --fix {tmp_path / 'appendonlydir'}" in message
    assert "rerun the trial without --resume" in message


def test_a_server_that_dies_says_how(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path, appendfsync="always") as server:
        assert server.exit_reason() is None
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        assert (
            server.exit_reason()
            == f"redis-server (pid {server.process.pid}) was killed by signal 9"
        )
    assert server.exit_reason() is None  # stopped by us: nothing to report
