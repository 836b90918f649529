"""Fault injection for kill/restart tests: a file named by an environment variable arms one crash.

While the file exists and holds a number the crash site matches (a ticket a generator claimed,
the version of an eval request it claimed), the process that matches deletes it and exits
abruptly, holding whatever leases it had (as a SIGKILL would). unlink is atomic, so one process
crashes per file. Never set outside tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable

FAULT_EXIT_CODE = 86


def crash_if_armed(env: str, matches: Callable[[int], bool], what: str) -> None:
    """Exit now (code FAULT_EXIT_CODE, saying `what`) if $`env` names a file holding a number
    `matches` accepts; the file is removed first, so the restart goes on."""
    path = os.environ.get(env)
    if not path:
        return
    try:
        with open(path) as handle:
            if not matches(int(handle.read())):
                return
        os.unlink(path)
    except FileNotFoundError:
        return
    print(f"fault injection: exiting {what}", flush=True)
    os._exit(FAULT_EXIT_CODE)
