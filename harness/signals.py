"""Stop signals (Ctrl-C's SIGINT, SIGTERM) turned into a callback, in one place.

Why a callback and not the default (KeyboardInterrupt, or death on SIGTERM): an exception can land
anywhere (mid MLflow write, mid Popen, mid Redis push), and children started in sessions of their
own never see the terminal's Ctrl-C. So every long-running command records the signal, checks it
at a point where stopping is safe, and tears its children down itself.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)

OnSignal = Callable[[int], None]


class SignalLatch:
    """Remembers the last stop signal received; pass `latch.set` as the callback."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def set(self, signum: int) -> None:
        self.signum = signum

    @property
    def caught(self) -> bool:
        return self.signum is not None


def install(on_signal: OnSignal, signals: Sequence[int] = STOP_SIGNALS) -> dict[int, Any]:
    """Route `signals` to `on_signal(signum)` from now on; returns the handlers it replaced.

    For a process that keeps the handlers until it exits (a generator worker); anything that
    returns to a caller uses `forward_signals`, which puts the old handlers back.
    """

    def handler(signum: int, _frame: FrameType | None) -> None:
        on_signal(signum)

    return {signum: signal.signal(signum, handler) for signum in signals}


@contextmanager
def forward_signals(on_signal: OnSignal, signals: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """Route `signals` to `on_signal(signum)` while the block runs; restore afterwards.

    Outside the main thread (where Python forbids signal handlers) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = install(on_signal, signals)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
