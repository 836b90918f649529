"""connect(): checked clients and errors that name the URL without leaking the password."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

from buffer.connection import (
    BufferConnectionError,
    RedisWritesRefusedError,
    RunKeys,
    connect,
    redact,
    redis_failures_in_one_line,
)
from tests.conftest import RedisInstance


def test_connect_pings_and_returns_bytes(redis_server: RedisInstance) -> None:
    client = connect(redis_server.url)
    client.set("k", "v")
    assert client.get("k") == b"v"  # decode_responses=False: payloads stay bytes
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 30.0


def test_wrong_password_is_a_clear_error(redis_server: RedisInstance) -> None:
    url = f"redis://:not-the-password@127.0.0.1:{redis_server.port}/0"
    with pytest.raises(BufferConnectionError, match="refused our credentials") as info:
        connect(url)
    assert "not-the-password" not in str(info.value)
    assert "***" in str(info.value)


def test_unreachable_redis_fails_fast() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connection refused
        with pytest.raises(BufferConnectionError, match="cannot reach Redis"):
            connect(f"redis://:pw@127.0.0.1:{port}/0", connect_timeout_s=2)


def test_only_redis_schemes_are_accepted() -> None:
    with pytest.raises(ValueError, match="redis:// or rediss://"):
        connect("http://:secret@localhost:6379")


def test_redact_hides_only_the_password() -> None:
    assert redact("redis://:s3cret@h:1/0") == "redis://:***@h:1/0"
    assert redact("rediss://user:s3cret@h:1/0") == "rediss://user:***@h:1/0"
    assert redact("redis://h:1/0") == "redis://h:1/0"


def test_run_keys_are_namespaced_and_validated() -> None:
    keys = RunKeys("exp1.arm-gspo_seed0")
    assert keys.stream == "gspo:exp1.arm-gspo_seed0:rollouts"
    assert keys.telemetry("gen-1") == "gspo:exp1.arm-gspo_seed0:telemetry:gen-1"
    for bad in ("", "a:b", "a b", "x" * 129):
        with pytest.raises(ValueError, match="run id"):
            RunKeys(bad)


def test_connection_is_a_context_manager(redis_server: RedisInstance) -> None:
    # Identify the connection by its server-side id: counting clients races with connections
    # of earlier tests that the garbage collector closes while this test runs.
    probe = redis_server.client()
    with connect(redis_server.url) as client:
        own_id = client.client_id()
        assert own_id in {int(c["id"]) for c in probe.client_list()}
    assert own_id not in {int(c["id"]) for c in probe.client_list()}  # closed on exit


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make certs")
def test_rediss_with_a_private_ca(tmp_path: Path) -> None:
    # A throwaway CA and a server certificate for localhost / 127.0.0.1.
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "1", "-subj", "/CN=test-ca", cwd=tmp_path)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost", cwd=tmp_path)  # fmt: skip
    (tmp_path / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "san.ext",
             cwd=tmp_path)  # fmt: skip
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", "server.crt", "--tls-key-file", "server.key",
         "--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no", "--requirepass", "pw",
         "--save", "", "--dir", str(tmp_path)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"rediss://:pw@localhost:{port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                client = connect(url, tls_ca_file=str(tmp_path / "ca.crt"))
                break
            except BufferConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.set("k", b"v")
        assert client.get("k") == b"v"
        client.close()
        # Without our CA the server's certificate cannot be verified: refused, clearly.
        with pytest.raises(BufferConnectionError, match="cannot reach Redis"):
            connect(url, connect_timeout_s=2)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_a_redis_that_cannot_write_its_aof_is_one_line(redis_server: RedisInstance) -> None:
    """Redis refuses writes (MISCONF) when its disk is full; components used to crash on the
    ResponseError with a traceback (a generator in a restart loop)."""
    refusal = "MISCONF Errors writing to the AOF file: No space left on device"
    with (
        pytest.raises(RedisWritesRefusedError) as raised,
        redis_failures_in_one_line(redis_server.url),
    ):
        raise redis.ResponseError(refusal)
    message = str(raised.value)
    assert isinstance(raised.value, BufferConnectionError) and "\n" not in message
    assert f"({refusal})" in message and "rerun the trial with --resume" in message
    assert redis_server.password not in message
    with (
        pytest.raises(redis.ResponseError, match="WRONGTYPE"),
        redis_failures_in_one_line(redis_server.url),
    ):
        raise redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind")
