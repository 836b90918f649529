"""`python -m harness.tasks.math_worker PARENT_PID`: math-verify equivalence checks, one per line.

Runs in its own process so that the MATH verifier (`harness.tasks.math_answer`) can bound a
check's time by killing this process: math-verify's own timeout uses SIGALRM, which works only in
a main thread and cannot interrupt a long computation inside C code (a huge integer power, say).
This module imports nothing from torch or transformers, so it starts in about a second.

Protocol (JSON lines; stdout carries nothing else):
- on start, after the imports: `{"ready": true}`
- request `{"gold": latex, "answer": latex}` -> `{"equal": bool}`, or `{"error": text}` when
  math-verify raised. Both strings are the contents of a `\\boxed{...}` (without the wrapper).
The worker exits at EOF on stdin, and (Linux) when its parent dies, via PR_SET_PDEATHSIG.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
from typing import Any

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent exits (Linux; a no-op elsewhere).

    Without it a worker stuck in a pathological computation would outlive a killed generator.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def make_checker() -> Any:
    """`(gold, answer) -> bool` by math-verify, with its signal-based timeouts off (see module)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # math-verify warns once per process that its timeouts are off: they are on purpose.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    extraction = [LatexExtractionConfig(), ExprExtractionConfig()]

    def boxed(latex: str) -> list[Any]:
        return parse(f"\\boxed{{{latex}}}", extraction_config=extraction, parsing_timeout=None)

    def check(gold: str, answer: str) -> bool:
        return bool(verify(boxed(gold), boxed(answer), timeout_seconds=None))

    return check


# The protocol's channel; sys.stdout is pointed at stderr so that stray prints from sympy or
# math-verify cannot corrupt it.
PROTOCOL = sys.stdout


def reply(message: dict[str, Any]) -> None:
    PROTOCOL.write(json.dumps(message) + "\n")
    PROTOCOL.flush()


def serve() -> None:
    sys.stdout = sys.stderr
    check = make_checker()
    reply({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply({"equal": check(request["gold"], request["answer"])})
        except Exception as exc:  # a parse failure is an answer (not equal), not a crash
            reply({"error": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    die_with_parent(int(sys.argv[1]))
    serve()
