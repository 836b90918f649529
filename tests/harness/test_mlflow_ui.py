"""`harness ui` starts a real MLflow server on 127.0.0.1 over an output dir's store.

Slow (the MLflow server takes 5-30 s to import and start on a small machine), so it is kept out
of test_tracking.py; the pure parts (store resolution, argv) are tested there.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console

from harness.experiment.mlflow_ui import UiError, serve_ui, start_ui, stop_ui
from tests.harness.mlflow_store import fresh_sqlite_store, template_store
from tests.harness.trial_helpers import process_alive

pytestmark = pytest.mark.e2e  # a real MLflow server

REPO = Path(__file__).resolve().parents[2]


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


def _use_then_ctrl_c(port: int, out_dir: Path, seen: dict, timeout_s: float = 120.0) -> None:
    """Once the UI answers on `port`: what a second `start_ui` on the port says, and the
    store's experiments as the server lists them (into `seen`); then SIGINT this process (a
    terminal's Ctrl-C)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                break
        except OSError:
            time.sleep(0.25)
    try:
        try:
            second = start_ui(out_dir, port)
        except UiError as exc:
            seen["second start"] = str(exc)
        else:  # it should not have started: stopped, and the assertion below fails
            stop_ui(second)
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=5"
        with urllib.request.urlopen(url, timeout=10) as response:
            seen["experiments"] = [e["name"] for e in json.load(response)["experiments"]]
    finally:
        time.sleep(1.0)  # serve_ui routes SIGINT right after the server first answers
        os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow
def test_the_served_ui_lists_the_store_refuses_a_busy_port_and_stops_on_ctrl_c(
    out_dir: Path,
) -> None:
    """`serve_ui` (what `harness ui` runs) serves the output dir's store on 127.0.0.1; a
    second UI on its port fails naming the port; Ctrl-C stops the server's whole group and is
    a normal end."""
    port = free_port()
    seen: dict = {}
    helper = threading.Thread(target=_use_then_ctrl_c, args=(port, out_dir, seen), daemon=True)
    helper.start()
    printed = io.StringIO()
    assert serve_ui(out_dir, port, console=Console(file=printed)) == 0
    helper.join(timeout=30)
    assert f"MLflow UI: http://127.0.0.1:{port}" in printed.getvalue()
    assert f"port {port} on 127.0.0.1 is in use" in seen["second start"]
    assert seen["experiments"] == ["Default"]
    with pytest.raises(OSError):  # the server's whole group is gone: nothing answers
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)


@pytest.mark.slow
def test_sigterm_stops_a_real_harness_ui_and_its_server(out_dir: Path) -> None:
    """SIGTERM used to end `harness ui` at once, leaving the server (own session) under init."""
    port = free_port()
    command = [sys.executable, "-m", "harness.cli", "ui", str(out_dir), "--port", str(port)]
    with (out_dir / "ui.log").open("wb") as log:
        ui = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        server_pid = None
        while server_pid is None and time.monotonic() < deadline:
            assert ui.poll() is None, (out_dir / "ui.log").read_text()
            server_pid = _listener_pid(port)
            time.sleep(0.25)
        assert server_pid is not None, "the MLflow server never listened"
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=30) == 0
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        assert not process_alive(server_pid)
    finally:
        if ui.poll() is None:
            ui.kill()
            ui.wait()


def _listener_pid(port: int) -> int | None:
    """The pid of the `mlflow server` child of any process serving `port`, once /health answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
            pass
    except OSError:
        return None
    for status in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = status.read_bytes().split(b"\0")
            if b"mlflow" in argv and b"server" in argv and str(port).encode() in argv:
                return int(status.parent.name)
    return None
