"""Which sync object each process of an experiment uses, decided here and nowhere else.

With output on a path (local or shared) nobody syncs, and every function here returns None or a
sync that does nothing. With output in a bucket the decisions are:

    driver      runs in its working copy (`Storage.driver_dir`), restored from the bucket;
                hands the bucket to every trial through the environment (`Storage.env`)
    supervisor  `SupervisorSync`: with private components (the executor says) it pushes only
                its files and pulls the learner's; otherwise it pushes the shared copy whole
    host        (Ray) makes a component's private working copy and syncs its log
    component   `TrialSync` of its private working copy, when its host gave it one

Which files each side owns, and when it syncs them, is in `trial_storage`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from contract.layout import TrialPaths
from harness.config import ExperimentConfig
from harness.storage.experiment_storage import experiment_storage, restore_working_copy
from harness.storage.trial_storage import ENV_TRIAL, Storage, SupervisorSync, TrialSync


class Placement(Protocol):
    """What storage asks of an executor (`harness.executors.base.Executor`): whether components
    keep private working copies. A Protocol, so that storage stays below the executors, which
    use it (a Ray component host's working copy)."""

    private_components: bool


def setup_driver_storage(
    cfg: ExperimentConfig, out: Path | str | None, executor: Placement
) -> tuple[Storage | None, Path | str | None]:
    """The experiment's bucket (None for a path) and where the driver runs: the bucket's
    working copy, restored (without what private components keep themselves), or `out`."""
    storage = experiment_storage(cfg, out)
    if storage is None:
        return None, out
    return storage, restore_working_copy(storage, private_components=executor.private_components)


def setup_supervisor_sync(trial_root: Path, executor: Placement) -> SupervisorSync:
    """The trial supervisor's sync, for the bucket its environment names (none: no sync)."""
    return SupervisorSync.for_trial(trial_root, private_components=executor.private_components)


def setup_component_sync(trial_root: Path) -> TrialSync | None:
    """A learner's or generator's sync, when its host gave it a private working copy."""
    return TrialSync.for_component(trial_root)


@dataclass(frozen=True)
class HostCopy:
    """A component's private working copy on its node, and its sync with the bucket."""

    root: Path
    sync: TrialSync

    @property
    def paths(self) -> TrialPaths:
        return TrialPaths(self.root)


def setup_host_copy(env: Mapping[str, str], component: str, node: str) -> HostCopy | None:
    """The private working copy a component host (Ray actor) runs `component` in on `node`,
    when the supervisor's environment `env` names a bucket; None for output on a path."""
    storage = Storage.from_env(env)
    if storage is None:
        return None
    local = storage.component_dir(env[ENV_TRIAL], component, node)
    return HostCopy(local, TrialSync(storage, env[ENV_TRIAL], local))
