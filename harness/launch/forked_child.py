"""The supervisor's side of a zygote (`harness.cli_zygote`): where one is, and asking it to
fork a component start (`warm_child.WarmChild` makes every start it can a fork).

A forked component's pid is its own, in its own session, so a kill by pid or process group
reaches it as it would reach a cold one; the zygote reports its exit code (or killing signal)
over the connection the request came on, which the supervisor keeps open while it runs.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.launch.warm_protocol import ProtocolError, decode, encode, read_line

# Set by whoever started a zygote (`harness run`, the test suite) in the supervisors'
# environment: JSON {"socket": path, "pid": pid}.
ZYGOTE_ENV = "HARNESS_ZYGOTE"
PID_REPLY_TIMEOUT_S = 10.0  # a fork takes milliseconds; this only bounds a stuck zygote


def zygote_from_env(environ: Mapping[str, str] = os.environ) -> tuple[str, int] | None:
    """(socket path, pid) of the zygote this process's components may be forked by, or None
    (unset or unreadable: components start cold)."""
    text = environ.get(ZYGOTE_ENV)
    if not text:
        return None
    try:
        data = json.loads(text)
        return str(data["socket"]), int(data["pid"])
    except (ValueError, KeyError, TypeError):
        return None


def zygote_env(socket_path: Path, pid: int) -> dict[str, str]:
    return {ZYGOTE_ENV: json.dumps({"socket": str(socket_path), "pid": pid})}


def request_fork(conn: socket.socket, assignment: dict[str, Any]) -> int | None:
    """Hand the zygote at the other end of `conn` one start; the forked pid, or None (then the
    connection is closed, which kills anything the zygote forked for it)."""
    try:
        conn.settimeout(PID_REPLY_TIMEOUT_S)
        conn.sendall(encode(assignment))
        pid = decode(read_line(conn)).get("pid")
    except (OSError, ProtocolError):
        pid = None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        conn.close()
        return None
    return pid


__all__ = ["ZYGOTE_ENV", "request_fork", "zygote_env", "zygote_from_env"]
