"""Stop signals become a callback while a block runs, and the old handlers come back after it."""

from __future__ import annotations

import os
import signal
import threading

from harness.signals import SignalLatch, forward_signals, install


def test_signals_reach_the_callback_and_old_handlers_are_restored() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    latch = SignalLatch()
    with forward_signals(latch.set):
        assert not latch.caught
        os.kill(os.getpid(), signal.SIGTERM)  # handled in this (the main) thread, not fatal
        assert latch.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: the last one is kept
        assert latch.signum == signal.SIGINT
    assert {s: signal.getsignal(s) for s in before} == before


def test_only_the_named_signals_are_routed() -> None:
    previous_term = signal.getsignal(signal.SIGTERM)
    latch = SignalLatch()
    with forward_signals(latch.set, signals=(signal.SIGINT,)):
        assert signal.getsignal(signal.SIGTERM) is previous_term
        os.kill(os.getpid(), signal.SIGINT)
    assert latch.signum == signal.SIGINT


def test_outside_the_main_thread_nothing_is_installed() -> None:
    seen: list[object] = []

    def body() -> None:
        with forward_signals(SignalLatch().set):
            seen.append(signal.getsignal(signal.SIGTERM))

    previous = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=10)
    assert seen == [previous]


def test_install_returns_the_handlers_it_replaced() -> None:
    latch = SignalLatch()
    previous = install(latch.set, signals=(signal.SIGTERM,))
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert latch.signum == signal.SIGTERM
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert signal.getsignal(signal.SIGTERM) is previous[signal.SIGTERM]
