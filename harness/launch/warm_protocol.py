"""What a trial's supervisor and a warm component process say to each other, and nothing else.

A warm component (`harness.cli_warm`) is a learner or generator process that
`harness run` keeps across the trials of one slot, so a trial does not pay the imports of torch,
transformers and vLLM, nor (for vLLM) the engine's start, again. The supervisor hands it one
trial's component command over a Unix socket and reads back its exit code:

    supervisor -> warm:  {"argv": [...], "env": {...}, "cwd": "...", "log": "..."}  (one line)
    warm -> supervisor:  {"exit": 0}                                                (one line)

Messages are JSON lines (never pickles: rule 5). The socket lives in a 0700 directory and each
side checks the peer's uid, so only this user can hand a warm process work. The supervisor
keeps the connection open while the component runs: the warm process ends at once when it
closes (the supervisor died, even by SIGKILL), as a cold component dies with its supervisor.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Mapping
from typing import Any

# Set by `harness run` in a trial's environment: JSON {component name: {"socket": path, "pid":
# pid}}, the warm processes of the trial's slot ("learner", "generator-0", ...).
WARM_COMPONENTS_ENV = "HARNESS_WARM_COMPONENTS"
# Set inside a warm process: engines (vLLM) are kept across its trials (`generators.engines`).
WARM_ENGINES_ENV = "HARNESS_WARM_ENGINES"
# The exit code a supervisor reports for a warm process that vanished mid-trial without a reply
# (SIGKILLed, or ended by `os._exit`): as a cold component killed by SIGKILL reports.
VANISHED_CODE = -9
MAX_MESSAGE_BYTES = 1 << 20


class ProtocolError(RuntimeError):
    """A message that is not one JSON object on one line, or one too long."""


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"not a JSON line: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"expected a JSON object, got {type(message).__name__}")
    return message


def read_line(conn: socket.socket) -> bytes:
    """One line from a blocking socket (without its newline); b'' when it closed before one."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
        if len(data) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message longer than {MAX_MESSAGE_BYTES} bytes")
    return data[:-1]


class ExitReply:
    """The `{"exit": code}` line that ends a connection to a warm process or the zygote, read
    without blocking: `poll()` is None until it is in, then the code; VANISHED_CODE when the
    other end closed (or sent something else) without one."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.code: int | None = None
        self._data = b""

    def poll(self) -> int | None:
        if self.code is None:
            self.code = self._read()
        return self.code

    def _read(self) -> int | None:
        try:
            chunk = self.conn.recv(4096)
        except (BlockingIOError, TimeoutError):
            return None
        except OSError:
            return VANISHED_CODE
        if not chunk:
            return VANISHED_CODE
        self._data += chunk
        if not self._data.endswith(b"\n"):
            return None
        try:
            code = decode(self._data[:-1]).get("exit")
        except ProtocolError:
            return VANISHED_CODE
        return code if isinstance(code, int) and not isinstance(code, bool) else VANISHED_CODE


def peer_pid_and_uid(conn: socket.socket) -> tuple[int, int]:
    """The pid and uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def same_user(conn: socket.socket) -> bool:
    return peer_pid_and_uid(conn)[1] == os.getuid()


def connect(path: str, timeout_s: float) -> socket.socket | None:
    """A connection to the process listening at `path` (a warm process, a zygote) if it is this
    user's, else None (none listens any more, or a stranger does)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout_s)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return None
    if not same_user(conn):
        conn.close()
        return None
    return conn


def warm_components_from_env(
    environ: Mapping[str, str] = os.environ,
) -> dict[str, tuple[str, int]]:
    """{component name: (socket path, pid)} from WARM_COMPONENTS_ENV in `environ`; {} when unset
    or unreadable (a component then starts cold, which is always right)."""
    raw = environ.get(WARM_COMPONENTS_ENV)
    if not raw:
        return {}
    try:
        table = json.loads(raw)
        return {name: (str(entry["socket"]), int(entry["pid"])) for name, entry in table.items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}


def warm_components_env(table: dict[str, tuple[str, int]]) -> dict[str, str]:
    """WARM_COMPONENTS_ENV for a trial whose slot has the warm processes of `table`."""
    entries = {name: {"socket": path, "pid": pid} for name, (path, pid) in table.items()}
    return {WARM_COMPONENTS_ENV: json.dumps(entries, sort_keys=True)}


__all__ = [
    "MAX_MESSAGE_BYTES",
    "VANISHED_CODE",
    "WARM_COMPONENTS_ENV",
    "WARM_ENGINES_ENV",
    "ExitReply",
    "ProtocolError",
    "connect",
    "decode",
    "encode",
    "peer_pid_and_uid",
    "read_line",
    "same_user",
    "warm_components_env",
    "warm_components_from_env",
]
