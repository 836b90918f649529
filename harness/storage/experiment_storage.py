"""`harness run` with output in a bucket: the driver's working copy, restored and published.

The driver runs the experiment in a local working copy (`Storage.driver_dir`), exactly as it
would run one in `output_dir`: locks, MLflow's SQLite store and the report need POSIX files.
Before the run, files the bucket has and the copy lacks are fetched (a resume on a new
machine); after it, the driver's own files go up. Trial files are synced by each trial's
supervisor and components while the trial runs (`trial_storage`).
"""

from __future__ import annotations

from pathlib import Path

from contract.layout import CHECKPOINTS_DIR, TRIALS_DIR, WEIGHTS_DIR
from harness.config import ExperimentConfig
from harness.storage.mirror import Mirror
from harness.storage.remote_tree import StorageError, is_uri, join_uri
from harness.storage.trial_storage import SUPERVISOR_FILES, Storage


def experiment_storage(cfg: ExperimentConfig, out: str | Path | None) -> Storage | None:
    """The bucket `--out` or `output_dir` names (`<output_dir>/<name>`), or None for a path."""
    if out is not None:
        uri = str(out) if is_uri(str(out)) else None
    else:
        uri = join_uri(cfg.output_dir, cfg.name) if is_uri(cfg.output_dir) else None
    if uri is None:
        return None
    scratch = Path(cfg.executor.scratch_dir).expanduser().resolve()
    storage = Storage(uri, scratch, cfg.executor.sync_interval_s)
    _ = storage.tree  # a bad scheme or missing credentials fail now, before any trial
    return storage


def restore_working_copy(storage: Storage, private_components: bool) -> Path:
    """The driver's working copy, with what the bucket has and it lacks (nothing overwritten).

    With private components (Ray) the learner keeps checkpoints and weights itself, so the
    driver never needs them."""
    local = storage.driver_dir()
    local.mkdir(parents=True, exist_ok=True)
    skip = (CHECKPOINTS_DIR, WEIGHTS_DIR) if private_components else ()
    try:
        Mirror(local, storage.tree).pull([""], delete=False, overwrite=False, skip_dirs=skip)
    except OSError as exc:
        raise StorageError(f"cannot read the experiment from {storage.tree.label}: {exc}") from exc
    return local


def publish_working_copy(storage: Storage, local: Path) -> None:
    """Push what the driver owns: the experiment's files (resolved config, report, MLflow
    store) and each trial's supervisor files; the rest was pushed by its writer."""
    tree = storage.tree
    top = [entry.name for entry in local.iterdir() if entry.name != TRIALS_DIR]
    trials = (
        sorted(p.name for p in (local / TRIALS_DIR).iterdir())
        if (local / TRIALS_DIR).is_dir()
        else []
    )
    owned = [*top, *(f"{TRIALS_DIR}/{t}/{name}" for t in trials for name in SUPERVISOR_FILES)]
    try:
        Mirror(local, tree).push(owned, delete=False)
    except OSError as exc:
        raise StorageError(f"cannot publish the experiment to {tree.label}: {exc}") from exc
