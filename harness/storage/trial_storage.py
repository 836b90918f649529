"""Who syncs which trial files with the bucket, and when (output_dir/--out is a URI).

Ownership decides direction, so no file ever has two writers:

    supervisor (driver)  trial.json, resolved_config.yaml, prompts.parquet, trial.log, redis/
    learner              metrics.parquet/, evals.parquet/, rollouts.parquet/, trained_groups/,
                         checkpoints/, learner_outcome.json, weights/ (remote_weights: before
                         each announce)
    each component       logs/<component>.log (pushed by its host)

With the Ray executor every component keeps a private working copy on its node
(`<scratch>/<key>/components/<trial>/<component>@<node>`; private even on one machine, so
nothing can lean on a shared path), pulls the supervisor's files before it starts, and pushes
what it owns.
The learner uploads its checkpoint *before* it acknowledges the checkpoint's groups in Redis
(`LearnerPorts.before_ack`): a resume on another node must find in the bucket the checkpoint that
matches what Redis let go of. The supervisor pulls the learner's progress to show it and to
judge the outcome. With the local executor the components share the supervisor's working copy,
which the supervisor pushes whole.

The driver's working copy (`<scratch>/<key>/driver`) is what `harness run` reads and writes as
its experiment directory; MLflow and the report read it, then it is pushed.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Final

from contract.layout import (
    CHECKPOINTS_DIR,
    EVALS_DIR,
    LEARNER_OUTCOME,
    LOGS_DIR,
    METRICS_DIR,
    PROMPTS_FILE,
    REDIS_DIR,
    RESOLVED_CONFIG,
    ROLLOUTS_DIR,
    TRAINED_GROUPS_DIR,
    TRIAL_JSON,
    TRIAL_LOG,
    TRIALS_DIR,
    WEIGHTS_DIR,
)
from harness.storage.mirror import Mirror
from harness.storage.remote_tree import RemoteTree

ENV_URI: Final = "HARNESS_STORAGE_URI"  # the experiment's URI
ENV_SCRATCH: Final = "HARNESS_SCRATCH_DIR"  # where working copies live on this machine
ENV_TRIAL: Final = "HARNESS_STORAGE_TRIAL"  # the trial a component belongs to
ENV_SYNC_S: Final = "HARNESS_STORAGE_SYNC_S"  # how often progress is pushed / pulled

SUPERVISOR_INPUTS: Final = (TRIAL_JSON, RESOLVED_CONFIG, PROMPTS_FILE)  # what components read
SUPERVISOR_FILES: Final = (*SUPERVISOR_INPUTS, TRIAL_LOG)
LEARNER_PROGRESS: Final = (
    METRICS_DIR,
    EVALS_DIR,
    ROLLOUTS_DIR,
    TRAINED_GROUPS_DIR,
    LEARNER_OUTCOME,
)
LEARNER_FILES: Final = (*LEARNER_PROGRESS, CHECKPOINTS_DIR)
# A fresh (not resumed) trial starts from nothing: these go, locally and in the bucket.
STALE_ON_FRESH: Final = (*LEARNER_FILES, WEIGHTS_DIR, REDIS_DIR, LOGS_DIR)


@dataclass(frozen=True)
class Storage:
    """An experiment's remote home and this machine's scratch directory for working copies."""

    uri: str
    scratch: Path
    sync_interval_s: float = 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Storage | None:
        env = os.environ if env is None else env
        if not env.get(ENV_URI):
            return None
        return cls(env[ENV_URI], Path(env[ENV_SCRATCH]), float(env.get(ENV_SYNC_S, "5")))

    def env(self) -> dict[str, str]:
        return {
            ENV_URI: self.uri,
            ENV_SCRATCH: str(self.scratch),
            ENV_SYNC_S: repr(self.sync_interval_s),
        }

    @property
    def key(self) -> str:
        """Working copies of two experiments (or buckets) never share a directory."""
        return hashlib.sha256(self.uri.encode()).hexdigest()[:12]

    def driver_dir(self) -> Path:
        return self.scratch / self.key / "driver"

    def component_dir(self, trial: str, component: str, node: str) -> Path:
        """Per node as well: a component retried on another node starts from the bucket, as
        it would on a separate machine, even when several nodes share one disk."""
        return self.scratch / self.key / "components" / trial / f"{component}@{node}"

    @cached_property
    def tree(self) -> RemoteTree:
        """The experiment's tree, opened once: opening an S3 URI without a region asks the
        bucket for it, a request every later tree of this process can do without."""
        return RemoteTree.open(self.uri)

    def trial_tree(self, trial: str) -> RemoteTree:
        return self.tree.child(f"{TRIALS_DIR}/{trial}")


class Every:
    """True at most once per `interval_s` (the first call included)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last = -float("inf")

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return False
        self._last = now
        return True


class TrialSync:
    """One process's working copy of one trial, and the bucket's copy of it."""

    def __init__(self, storage: Storage, trial: str, local_root: Path) -> None:
        self.storage = storage
        self.trial = trial
        self.remote = storage.trial_tree(trial)
        self.mirror = Mirror(local_root, self.remote)
        self._periodic = Every(storage.sync_interval_s)

    @classmethod
    def for_component(cls, local_root: Path) -> TrialSync | None:
        """A component process's sync, when its host gave it a private working copy."""
        storage = Storage.from_env()
        trial = os.environ.get(ENV_TRIAL)
        if storage is None or not trial:
            return None
        return cls(storage, trial, local_root)

    def push(self, prefixes: Iterable[str], *, delete: bool = True) -> list[str]:
        return self.mirror.push(prefixes, delete=delete)

    def pull(self, prefixes: Iterable[str], *, delete: bool = True) -> list[str]:
        return self.mirror.pull(prefixes, delete=delete)

    def push_now_and_then(self, prefixes: Iterable[str]) -> None:
        if self._periodic.due():
            self.push(prefixes)

    def pull_now_and_then(self, prefixes: Iterable[str]) -> None:
        if self._periodic.due():
            self.pull(prefixes)

    def forget(self, prefixes: Iterable[str]) -> None:
        """Delete `prefixes` in the bucket (a fresh trial's leftovers from an earlier attempt)."""
        for prefix in prefixes:
            self.remote.delete_tree(prefix)


class SupervisorSync:
    """The trial supervisor's side: its files up, the learner's progress down.

    `private_components`: the components run with private working copies (Ray executor), so the
    supervisor pushes only what it owns and pulls the rest; otherwise they share this working
    copy, and the supervisor pushes all of it.
    """

    def __init__(self, sync: TrialSync | None, private_components: bool) -> None:
        self.sync = sync
        self.private_components = private_components and sync is not None

    @classmethod
    def none(cls) -> SupervisorSync:
        """Output on a local or shared path: nothing to sync."""
        return cls(None, private_components=False)

    @classmethod
    def for_trial(cls, local_root: Path, private_components: bool) -> SupervisorSync:
        storage = Storage.from_env()
        sync = None if storage is None else TrialSync(storage, local_root.name, local_root)
        return cls(sync, private_components)

    def component_env(self) -> dict[str, str]:
        """What a component with its own working copy needs to find the bucket."""
        if self.sync is None or not self.private_components:
            return {}
        return {**self.sync.storage.env(), ENV_TRIAL: self.sync.trial}

    def prepared(self, resume: bool) -> None:
        """After the trial record is written, before any component starts."""
        if self.sync is None:
            return
        if not resume:
            self.sync.forget(STALE_ON_FRESH)
        self.sync.push(SUPERVISOR_INPUTS)

    def tick(self) -> None:
        """Called every poll: progress down (Ray), or everything up (local), now and then."""
        if self.sync is None:
            return
        try:
            if self.private_components:
                self.sync.pull_now_and_then(LEARNER_PROGRESS)
            else:
                self.sync.push_now_and_then(_ALL_BUT_REDIS)
        except OSError as exc:  # the learner's own uploads fail the trial if the store is gone
            print(f"warning: storage sync failed, trying again: {exc}", flush=True)

    def learner_exited(self) -> None:
        """Before the supervisor reads the learner's outcome and step count."""
        if self.sync is not None and self.private_components:
            self.sync.pull(LEARNER_PROGRESS)

    def finished(self) -> None:
        """After the final trial record, with Redis stopped (its AOF complete)."""
        if self.sync is None:
            return
        if self.private_components:
            self.sync.pull(LEARNER_PROGRESS)
            self.sync.pull([LOGS_DIR], delete=False)
            self.sync.push([*SUPERVISOR_INPUTS, REDIS_DIR])
        else:
            self.sync.push([*_ALL_BUT_REDIS, REDIS_DIR])


# Everything a trial directory holds except the Redis data dir, which is pushed once Redis has
# stopped (a live AOF changes under the upload).
_ALL_BUT_REDIS: Final = (*SUPERVISOR_INPUTS, *LEARNER_FILES, WEIGHTS_DIR, LOGS_DIR)
