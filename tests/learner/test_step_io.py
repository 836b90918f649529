"""StepWriter: the learner's step outputs on one background thread, in order, errors surfaced."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
from torch import nn

from learner.runtime.step_io import StepWriter, weight_snapshot


def test_jobs_run_in_submission_order_and_drain_waits_for_them() -> None:
    done: list[int] = []
    with StepWriter() as writer:
        for i in range(5):
            writer.submit(lambda i=i: (time.sleep(0.02 * (5 - i)), done.append(i)))  # slow first
        writer.drain()
        assert done == [0, 1, 2, 3, 4]
    assert done == [0, 1, 2, 3, 4]


def test_jobs_run_off_the_calling_thread() -> None:
    where: list[str] = []
    with StepWriter(name="io-test") as writer:
        writer.submit(lambda: where.append(threading.current_thread().name))
    assert where == ["io-test"]


def test_a_failed_job_is_raised_by_the_next_submit_and_later_jobs_are_skipped() -> None:
    ran: list[str] = []
    writer = StepWriter()

    def fail() -> None:
        raise OSError("disk full")

    writer.submit(fail)
    time.sleep(0.05)  # let it run
    with pytest.raises(OSError, match="disk full"):
        writer.submit(lambda: ran.append("after"))
    with pytest.raises(OSError, match="disk full"):
        writer.drain()
    with pytest.raises(OSError, match="disk full"):
        writer.close()
    assert ran == []


def test_a_failed_job_is_raised_by_drain() -> None:
    writer = StepWriter()
    writer.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        writer.drain()


def test_an_error_in_the_block_wins_over_a_write_error(caplog: pytest.LogCaptureFixture) -> None:
    finished: list[str] = []
    with (
        caplog.at_level(logging.ERROR),
        pytest.raises(KeyError, match="from the loop"),
        StepWriter() as writer,
    ):
        writer.submit(lambda: finished.append("earlier step's write"))
        writer.submit(lambda: 1 / 0)
        raise KeyError("from the loop")
    assert finished == ["earlier step's write"]  # completed steps' writes still finished
    assert "ZeroDivisionError" in caplog.text


def test_weight_snapshot_is_a_cpu_copy_unaffected_by_later_updates() -> None:
    module = nn.Linear(3, 2)
    snapshot = weight_snapshot(module)
    before = {k: v.clone() for k, v in snapshot.items()}
    with torch.no_grad():
        module.weight.add_(1.0)
    assert set(snapshot) == {"weight", "bias"}
    for name, tensor in snapshot.items():
        assert tensor.device.type == "cpu"
        assert torch.equal(tensor, before[name])
    assert not torch.equal(snapshot["weight"], module.weight.detach())
