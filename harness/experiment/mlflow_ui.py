"""`harness ui`: the MLflow web UI over an experiment's tracking store, on 127.0.0.1 only.

Given an output directory it serves that directory's SQLite store (`mlflow.db`) and artifact
root (`mlartifacts/`), the defaults `harness run` writes; given a URI it serves that store.
The server is a child process in its own session, stopped with its whole group on Ctrl-C or
SIGTERM.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rich.console import Console

from harness.experiment.tracking import DEFAULT_ARTIFACTS, DEFAULT_DB, artifact_location
from harness.launch.pool import stop_group
from harness.signals import SignalLatch, forward_signals

HOST = "127.0.0.1"


class UiError(RuntimeError):
    """The UI cannot be served; the message says what to fix."""


@dataclass(frozen=True)
class UiServer:
    """A started MLflow server process and where it answers."""

    process: subprocess.Popen[bytes]
    url: str


def ui_store(target: str | Path) -> tuple[str, str | None]:
    """(backend store URI, default artifact root) for an output dir, a .db file or a URI."""
    text = str(target)
    if "://" in text:
        return text, artifact_location(text)
    path = Path(text).expanduser().resolve()
    database = path / DEFAULT_DB if path.is_dir() else path
    if not database.is_file():
        raise UiError(
            f"no MLflow store at {database}: pass the output directory of a `harness run` "
            f"(it holds {DEFAULT_DB}) or a tracking URI such as sqlite:///path/mlflow.db"
        )
    return f"sqlite:///{database}", (database.parent / DEFAULT_ARTIFACTS).as_uri()


def ui_command(backend_uri: str, artifact_root: str | None, port: int) -> list[str]:
    """`python -m mlflow server` bound to 127.0.0.1 with one worker (a local, personal UI)."""
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri]
    argv += ["--host", HOST, "--port", str(port), "--workers", "1"]
    if artifact_root is not None:
        argv += ["--default-artifact-root", artifact_root]
    return argv


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise UiError(f"port {port} on {HOST} is in use ({exc}); pass another --port") from None


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_ui(
    target: str | Path,
    port: int = 5000,
    ready_timeout_s: float = 120.0,
    output: IO[bytes] | None = None,
) -> UiServer:
    """Start the server and wait (at most `ready_timeout_s`) until `/health` answers."""
    backend, artifacts = ui_store(target)
    _check_port_free(port)
    process = subprocess.Popen(
        ui_command(backend, artifacts, port),
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        start_new_session=True,
    )
    server = UiServer(process, f"http://{HOST}:{port}")
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise UiError(f"mlflow server exited with code {process.returncode}; see its output")
        if _answers(server.url):
            return server
        time.sleep(0.25)
    stop_ui(server)
    raise UiError(f"mlflow server did not answer at {server.url} within {ready_timeout_s:g} s")


def stop_ui(server: UiServer, grace_s: float = 10.0) -> None:
    """Stop the server's whole process group (uvicorn workers included)."""
    stop_group(server.process.pid, grace_s, server.process)


def serve_ui(out_dir_or_uri: str | Path, port: int = 5000, console: Console | None = None) -> int:
    """Serve the MLflow UI until Ctrl-C or SIGTERM; prints the URL. Returns the exit status.

    Both stop signals are caught from before the server starts: the server runs in a session of
    its own, so a SIGTERM that ended this process at once would leave it running under init.
    """
    console = console or Console()
    stop = SignalLatch()
    with forward_signals(stop.set):  # SIGINT and SIGTERM
        server = start_ui(out_dir_or_uri, port)
        try:
            console.print(f"MLflow UI: {server.url}  (Ctrl-C to stop)", highlight=False)
            while server.process.poll() is None and not stop.caught:
                time.sleep(0.5)
        finally:
            stop_ui(server)
    return 0 if stop.caught else int(server.process.returncode)  # a stop signal: a normal end
