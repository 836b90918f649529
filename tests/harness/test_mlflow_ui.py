"""`harness ui` starts a real MLflow server on 127.0.0.1 over an output dir's store.

Slow (the MLflow server takes 5-30 s to import and start on a small machine), so it is kept out
of test_tracking.py; the pure parts (store resolution, argv) are tested there.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest

from harness.experiment.mlflow_ui import UiError, start_ui, stop_ui
from tests.harness.mlflow_store import fresh_sqlite_store, template_store


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_ui_serves_the_output_dir_store_and_stops_cleanly(
    tmp_path: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fresh_sqlite_store(tmp_path, template_store(request.config, tmp_path_factory))
    port = free_port()
    with (tmp_path / "ui.log").open("wb") as log:
        server = start_ui(tmp_path, port, ready_timeout_s=120, output=log)
    try:
        assert server.url == f"http://127.0.0.1:{port}"
        with pytest.raises(UiError, match=f"port {port} on 127.0.0.1 is in use"):
            start_ui(tmp_path, port)
        url = f"{server.url}/api/2.0/mlflow/experiments/search?max_results=5"
        with urllib.request.urlopen(url, timeout=10) as response:
            names = [e["name"] for e in json.load(response)["experiments"]]
        assert names == ["Default"]
    finally:
        stop_ui(server, grace_s=10)
    assert server.process.returncode is not None
