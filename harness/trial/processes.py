"""Child processes that never outlive their parent.

Every component runs in its own process group (so a Ctrl-C in the terminal reaches only the
supervisor, which then decides the order of teardown) and asks the kernel to SIGTERM it when the
supervisor dies (PR_SET_PDEATHSIG), so even a SIGKILLed supervisor leaves no orphan.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    os.setsid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    """A supervised component process with its log file."""

    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    restarts: int = 0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
            # The supervisor is single-threaded; prctl(PDEATHSIG) has no spawn-safe equivalent.
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
        log.close()
        # Operators (and the kill/resume tests) find a component by its pid file.
        self.log_path.with_suffix(".pid").write_text(str(self.process.pid))

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the child's process group, then SIGKILL what is left after `timeout_s`."""
        if self.process is None or self.process.poll() is not None:
            return
        _signal_group(self.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            time.sleep(0.05)
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def python_module_args(module: str, *args: str) -> list[str]:
    """Run `python -m module args` with the interpreter of this process (the project's venv)."""
    return [sys.executable, "-m", module, *args]
