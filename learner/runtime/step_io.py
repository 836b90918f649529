"""The learner's step outputs, written on one background thread while the next step runs.

Why: after a step the learner writes the new weights (safetensors + fsyncs), announces the
version, prunes old versions, appends the step's metric row and its ledger of trained groups
(each a Parquet/JSON part + fsync). Done inline, that I/O sat on the learner's critical path: at
lag >= 1 in bounded mode the next batch is usually already waiting, so every millisecond of it
was a millisecond of training not done (benchmarks/trial_bench.py breaks a step down). Here it
runs on a worker thread (file writes and fsync release the GIL) while the main thread takes the
next batch and trains.

What keeps this exactly as safe as writing inline:
- jobs run one at a time in submission order, so version k is announced before version k + 1
  and metric rows land in step order;
- the weights a job writes are a snapshot taken when the step ended (`weight_snapshot`), never
  the live module the next step is updating;
- `drain()` runs before every checkpoint and before the learner returns, so a checkpoint never
  claims a step whose weights, metric row or ledger are not on disk (a resumed learner truncates
  everything newer than its checkpoint, as before);
- a failed job stops the worker; its exception is raised by the next `submit` or `drain`, so an
  I/O error still ends the trial with that error.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from types import TracebackType

import torch
from torch import nn

log = logging.getLogger(__name__)

Job = Callable[[], None]


def weight_snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of the module's state dict: what the weight store writes for this version.

    safetensors writes from CPU memory anyway, so copying to the CPU here costs no more than the
    write's own device-to-host copy, and the live (maybe GPU) weights are free to change.
    """
    return {
        name: tensor.detach().to("cpu", copy=True) for name, tensor in module.state_dict().items()
    }


class StepWriter:
    """A single worker thread that runs submitted jobs in order (see the module docstring)."""

    def __init__(self, name: str = "learner-step-io") -> None:
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if self._error is None:  # after a failure, later jobs are skipped
                    job()
            except BaseException as exc:
                self._error = exc
            finally:
                self._jobs.task_done()

    def _raise_pending(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, job: Job) -> None:
        """Queue `job`; raises the exception of an earlier job that failed."""
        self._raise_pending()
        self._jobs.put(job)

    def drain(self) -> None:
        """Wait until every queued job ran; raises the first failure."""
        self._jobs.join()
        self._raise_pending()

    def close(self) -> None:
        """Drain, then stop the thread."""
        try:
            self.drain()
        finally:
            self._jobs.put(None)
            self._thread.join()

    def __enter__(self) -> StepWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        # Already failing: finish the completed steps' writes, but let the original error win.
        try:
            self.close()
        except BaseException as io_error:
            log.error("learner step writes failed while handling %r: %r", exc, io_error)
