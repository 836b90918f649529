"""Component logs and pid files of a trial are private: 0600 in a 0700 logs directory."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from harness.launch.processes import Child
from tests.buffer.file_modes import assert_private


def _run(child: Child) -> None:
    child.start()
    assert child.process is not None and child.process.wait(timeout=60) == 0


def test_a_childs_log_and_pid_file_are_private(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    child = Child("echo", [sys.executable, "-c", "print('hello')"], logs / "echo.log")
    _run(child)
    assert (logs / "echo.log").read_text() == "hello\n"
    assert (logs / "echo.pid").read_text() == str(child.pid)
    assert_private(logs)


def test_a_restart_appends_and_tightens_an_older_log(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    (logs / "echo.log").write_text("before\n")
    (logs / "echo.log").chmod(0o644)  # as an earlier version left it
    (logs / "echo.pid").write_text("123456789")
    (logs / "echo.pid").chmod(0o644)
    child = Child("echo", [sys.executable, "-c", "print('after')"], logs / "echo.log")
    _run(child)
    assert (logs / "echo.log").read_text() == "before\nafter\n"
    assert (logs / "echo.pid").read_text() == str(child.pid)  # replaced, not appended
    assert_private(logs)


def test_a_reader_polling_the_pid_file_never_sees_it_empty(tmp_path: Path) -> None:
    """The fault-injection test (like an operator's script) polls the pid file while the
    supervisor restarts components; a truncate-then-write left a window where it read ''."""
    logs = tmp_path / "logs"
    child = Child("sleep", [sys.executable, "-c", "pass"], logs / "sleep.log")
    _run(child)
    seen: list[str] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen.append((logs / "sleep.pid").read_text())

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for _ in range(30):
            _run(child)
    finally:
        stop.set()
        reader.join()
    assert seen and all(text.isdigit() for text in seen)
    assert not list(logs.glob("*.tmp"))
