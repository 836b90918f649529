"""Component logs and pid files of a trial are private: 0600 in a 0700 logs directory."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.trial.processes import Child
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
