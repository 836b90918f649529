"""`harness ui` starts a real MLflow server on 127.0.0.1 over an output dir's store.

Slow (the MLflow server takes 5-30 s to import and start on a small machine), so it is kept out
of test_tracking.py; the pure parts (store resolution, argv) are tested there.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console

from harness.experiment.mlflow_ui import UiError, serve_ui, start_ui, stop_ui
from tests.harness.mlflow_store import fresh_sqlite_store, template_store


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def out_dir(
    tmp_path: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """An output directory holding a fresh copy of the template MLflow store."""
    fresh_sqlite_store(tmp_path, template_store(request.config, tmp_path_factory))
    return tmp_path


@pytest.mark.slow
def test_ui_serves_the_output_dir_store_and_stops_cleanly(out_dir: Path) -> None:
    port = free_port()
    with (out_dir / "ui.log").open("wb") as log:
        server = start_ui(out_dir, port, ready_timeout_s=120, output=log)
    try:
        assert server.url == f"http://127.0.0.1:{port}"
        with pytest.raises(UiError, match=f"port {port} on 127.0.0.1 is in use"):
            start_ui(out_dir, port)
        url = f"{server.url}/api/2.0/mlflow/experiments/search?max_results=5"
        with urllib.request.urlopen(url, timeout=10) as response:
            names = [e["name"] for e in json.load(response)["experiments"]]
        assert names == ["Default"]
    finally:
        stop_ui(server, grace_s=10)
    assert server.process.returncode is not None


def _ctrl_c_once_up(port: int, timeout_s: float = 120.0) -> None:
    """Send this process a SIGINT (a terminal's Ctrl-C) once the UI answers on `port`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                break
        except OSError:
            time.sleep(0.25)
    time.sleep(1.0)  # serve_ui routes SIGINT right after the server first answers
    os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow
def test_ctrl_c_stops_the_served_ui_and_is_a_normal_end(out_dir: Path) -> None:
    port = free_port()
    threading.Thread(target=_ctrl_c_once_up, args=(port,), daemon=True).start()
    assert serve_ui(out_dir, port, console=Console(file=io.StringIO())) == 0
    with pytest.raises(OSError):  # the server's whole group is gone: nothing answers
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
