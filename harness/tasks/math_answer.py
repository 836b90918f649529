"""The MATH verifier: the last `\\boxed{...}` of a response, equivalence checked by math-verify.

MATH answers are LaTeX (`\\frac{1}{2}`, `2\\sqrt{3}`, `(3, \\frac{\\pi}{2})`): string equality
would reject `0.5` for `\\frac{1}{2}`, so equivalence is decided by math-verify (Hugging Face's
maintained checker: LaTeX -> sympy, then numeric and symbolic comparison).

Time bound: some answers make sympy run for minutes or forever (`9^{9^{9^{9}}}` is evaluated
exactly). math-verify's own timeout uses SIGALRM, which needs the main thread and cannot stop a
computation inside C code, and a stuck check would stall a generator and with it the trial. So
the check runs in a worker process (`harness.tasks.math_worker`): the verifier waits at most
`task.math_timeout_s` for its answer, then kills the worker, scores 0 with reason `timeout`, and
starts a fresh worker on the next check. The worker starts on the first check (about a second).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

from harness.tasks.base import RewardInfo

BOXED_COMMANDS = ("\\boxed", "\\fbox")
# Importing sympy and math-verify takes about a second; a minute means the worker cannot start.
STARTUP_TIMEOUT_S = 60.0
READ_CHUNK = 1 << 16


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the `}` closing the `{` at `start` (escaped `\\{`, `\\}` skipped), else None."""
    depth, i = 0, start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # `\{` and `\}` are literal braces, not grouping
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Contents of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces kept; else None.

    A last box left unclosed (a response cut at the length limit) gives None: the final answer
    is missing, and an earlier box was not the model's final word.
    """
    position = max(text.rfind(command) for command in BOXED_COMMANDS)
    if position == -1:
        return None
    command = next(c for c in BOXED_COMMANDS if text.startswith(c, position))
    start = position + len(command)
    while start < len(text) and text[start] == " ":
        start += 1
    if start >= len(text) or text[start] != "{":
        return None
    end = _closing_brace(text, start)
    return None if end is None else text[start + 1 : end]


class CheckTimeoutError(TimeoutError):
    """One equivalence check ran past its limit; the worker was killed."""


class MathWorker:
    """Client of one `harness.tasks.math_worker` process: a check per call, each time-bounded."""

    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"task.math_timeout_s={timeout_s} must be > 0")
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._pending = b""
        self._lock = threading.Lock()  # one request in flight per worker
        self._finalizer: weakref.finalize | None = None

    def equal(self, gold: str, answer: str) -> dict[str, Any]:
        """The worker's reply to one check: `{"equal": bool}` or `{"error": text}`.

        Raises CheckTimeoutError (after killing the worker) when no reply comes in time; a worker
        that died mid-check (out of memory, say) is reported as an error and replaced next call.
        """
        with self._lock:
            process = self._ensure_started()
            assert process.stdin is not None
            request = json.dumps({"gold": gold, "answer": answer}) + "\n"
            try:
                process.stdin.write(request.encode())
                process.stdin.flush()
                line = self._read_line(time.monotonic() + self.timeout_s)
            except TimeoutError as exc:
                self._kill()
                raise CheckTimeoutError(
                    f"math check of {answer[:80]!r} took over {self.timeout_s:g} s "
                    "(task.math_timeout_s)"
                ) from exc
            except (EOFError, BrokenPipeError) as exc:
                self._kill()
                return {"error": f"the math-verify worker died: {exc}"}
            return json.loads(line)

    def close(self) -> None:
        """Stop the worker (it also exits on its own when this process does)."""
        with self._lock:
            self._kill()

    def _ensure_started(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._kill()  # reap a worker that exited on its own
        self._process = subprocess.Popen(
            [sys.executable, "-m", "harness.tasks.math_worker", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        # A verifier dropped without close() (or alive at exit) still stops its worker.
        self._finalizer = weakref.finalize(self, _stop, self._process)
        try:
            ready = json.loads(self._read_line(time.monotonic() + STARTUP_TIMEOUT_S))
        except (TimeoutError, EOFError) as exc:
            self._kill()
            raise RuntimeError(
                f"the math-verify worker did not start ({exc}); task.verifier=math needs the "
                "`math-verify[antlr4_13_2]` package (see pyproject.toml): check that "
                "`python -c 'import math_verify'` works (the worker's error is in stderr above)"
            ) from exc
        if ready != {"ready": True}:
            self._kill()
            raise RuntimeError(f"the math-verify worker sent {ready!r} instead of ready")
        return self._process

    def _read_line(self, deadline: float) -> bytes:
        """One line from the worker, or TimeoutError at `deadline` / EOFError if it exited."""
        assert self._process is not None and self._process.stdout is not None
        descriptor = self._process.stdout.fileno()
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no reply before the deadline")
            readable, _, _ = select.select([descriptor], [], [], remaining)
            if readable:
                chunk = os.read(descriptor, READ_CHUNK)
                if not chunk:
                    raise EOFError(f"the worker exited with code {self._process.wait()}")
                self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def _kill(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # runs _stop once
        self._finalizer = None
        self._process = None
        self._pending = b""


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Kill and reap a worker, closing our ends of its pipes."""
    if process.poll() is None:
        process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            stream.close()


class MathVerifier:
    """`(response, ground_truth) -> (reward, info)`: 1 when the last box equals the truth.

    The ground truth is the answer's LaTeX (verl's MATH files), or a solution whose last box
    holds it. info: `correct`, `parsed` (the boxed answer, None when missing) and `reason`:
    `match`, `not_equivalent`, `no_boxed`, `timeout`, or `verify_error` (math-verify raised).
    """

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.worker = MathWorker(timeout_s)

    def __call__(self, response: str, ground_truth: str) -> tuple[float, RewardInfo]:
        answer = last_boxed(response)
        if answer is None:
            return 0.0, {"correct": False, "parsed": None, "reason": "no_boxed"}
        gold = last_boxed(ground_truth)
        gold = ground_truth.strip() if gold is None else gold
        try:
            result = self.worker.equal(gold, answer)
        except CheckTimeoutError:
            return 0.0, {"correct": False, "parsed": answer, "reason": "timeout"}
        if "error" in result:
            info = {"correct": False, "parsed": answer, "reason": "verify_error"}
            return 0.0, {**info, "error": result["error"]}
        correct = bool(result["equal"])
        reason = "match" if correct else "not_equivalent"
        return float(correct), {"correct": correct, "parsed": answer, "reason": reason}

    def close(self) -> None:
        self.worker.close()
