"""Starting and stopping a zygote (`harness.cli_zygote`) for the supervisors of this process.

`harness run` starts one for its trials (unless its environment already names one, as the test
suite's does) and puts it in each trial's environment (`forked_child.ZYGOTE_ENV`): every cold
component start of every trial is then a fork of it. It dies with its starter (PR_SET_PDEATHSIG),
and every component it forked with it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.launch.forked_child import zygote_env, zygote_from_env
from harness.launch.processes import spawn_listening

KILL_WAIT_S = 10.0  # SIGKILL is asynchronous; this only bounds a stuck kernel


@dataclass
class ZygoteProcess:
    """A running zygote, its socket (in a private temporary directory) and its log."""

    socket_dir: Path
    process: subprocess.Popen[bytes]

    @classmethod
    def start(cls, log_path: Path, env: dict[str, str] | None = None) -> ZygoteProcess:
        # Unix socket paths are limited to 107 bytes: a short private directory.
        socket_dir = Path(tempfile.mkdtemp(prefix="harness-zygote-"))
        environment = dict(os.environ if env is None else env)
        process = spawn_listening(
            ["-m", "harness.cli_zygote"], socket_dir / "zygote.sock", log_path, environment
        )
        return cls(socket_dir, process)

    @property
    def env(self) -> dict[str, str]:
        """What a supervisor's environment needs to fork its components from this zygote."""
        return zygote_env(self.socket_dir / "zygote.sock", self.process.pid)

    def close(self) -> None:
        """SIGKILL it (whatever it forked dies with it) and remove its socket."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=KILL_WAIT_S)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def inherited_zygote(env: dict[str, str]) -> bool:
    """Whether `env` already names a zygote (then nobody starts another)."""
    return zygote_from_env(env) is not None


__all__ = ["ZygoteProcess", "inherited_zygote"]
