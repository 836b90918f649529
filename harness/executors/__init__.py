"""Where trials and their components run: `executor.kind` is read here, and only here.

`base` holds the Protocols both executors implement, `local` the subprocess executor, `ray` the
Ray one (`ray_components`: a trial's components as actors). `open_executor` picks the backend;
the driver asks the result for its trial pool, the supervisor for its component launcher, and
storage sync asks whether components keep private working copies.
"""

from __future__ import annotations

from harness.config.executor import ExecutorConfig
from harness.executors.base import Executor
from harness.executors.local import LocalExecutor
from harness.executors.ray import RayExecutor


def open_executor(executor: ExecutorConfig) -> Executor:
    """The executor `executor.kind` names (connecting happens later, in its pool or launcher)."""
    if executor.kind == "ray":
        return RayExecutor(executor)
    return LocalExecutor(executor.cpu_sets)


__all__ = ["Executor", "open_executor"]
