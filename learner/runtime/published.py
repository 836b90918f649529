"""The policy as the generators see it: full weights of each version, written to the weight
store and announced in the version registry (`publish`, a `StepWriter` job). The generators also
run the evals of the versions the learner asks for (`buffer.eval_requests`), on these weights.

Unsharded (a single process, or DDP): rank 0's module holds the whole policy; each version's
snapshot is a CPU copy of its state dict.

Sharded (`learner.parallel=fsdp`): no rank holds the whole policy. Every rank takes part in
gathering each version (`learner.runtime.sharding.gather_full_weights`, one tensor at a time,
kept by rank 0 in the published dtype: bf16 under `learner.dtype=bfloat16`). No rank evaluates,
so none ever holds an unsharded copy of the policy on its GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from buffer.streams import VersionPublisher, WeightWriter
from buffer.weight_store import read_state_dict
from learner.config import LearnerConfig
from learner.runtime.distributed import DistContext
from learner.runtime.sharding import DTYPES, gather_full_weights, is_sharded
from learner.runtime.step import StepModels
from learner.runtime.step_io import weight_snapshot

REPLAY_MISMATCH = "republished version"
"""How the line a non-bitwise replay prints starts (`PublishedWeights._check_replay`)."""


class PublishedWeights:
    """Snapshots of the policy and their publication (rank 0).

    `keep`: versions the weight store keeps (`versions_to_keep`)."""

    def __init__(
        self,
        models: StepModels,
        cfg: LearnerConfig,
        model_dir: Path,
        dist: DistContext,
        *,
        weights: WeightWriter,
        versions: VersionPublisher,
        keep: int,
        verify_replays: bool = False,
    ) -> None:
        """`verify_replays` (fixed mode): a version published before (a step a resumed learner
        redoes) is compared with the stored copy before it is replaced (`_check_replay`)."""
        self.policy = models.policy.module
        self.verify_replays = verify_replays
        self.weights, self.versions, self.keep = weights, versions, keep
        self.sharded = is_sharded(self.policy)
        self.dist = dist
        self.dtype = DTYPES[cfg.dtype]
        self.model_dir = model_dir
        # Sharded: v0 is gathered now, by every rank together (a fresh run publishes it; a
        # resume drops it unused, `forget_initial`).
        self._initial = self.snapshot() if self.sharded else None

    def snapshot(self) -> dict[str, torch.Tensor]:
        """This version's full weights on rank 0's CPU (empty on the other ranks). Sharded:
        every rank must call it together."""
        if self.sharded:
            return gather_full_weights(self.policy, self.dist, self.dtype)
        return weight_snapshot(self.policy) if self.dist.is_main else {}

    def publish(
        self, version: int, snapshot: dict[str, torch.Tensor], protect: Iterable[int] = ()
    ) -> None:
        """Write `version`'s weights, announce it, prune old versions but v0 and `protect`
        (versions whose evals a generator has yet to run), a `StepWriter` job."""
        if self.verify_replays:
            self._check_replay(version, snapshot)
        location = self.weights.write(version, snapshot, config_dir=self.model_dir)
        publish_unless_done(self.versions, version, location)
        self.weights.prune(keep=self.keep, protect={0, *protect})

    def _check_replay(self, version: int, snapshot: dict[str, torch.Tensor]) -> None:
        """Fixed mode redoes steps (a resume after a kill, a rewind past a damaged checkpoint),
        so a version it publishes again should equal the copy the generators may already have
        used: the stored one is read back and compared tensor by tensor, not trusted. A
        difference is legitimate only where the replay is not bitwise by construction (a resume
        at another number of learner ranks reduces in another order), so it is said in one
        line (REPLAY_MISMATCH) and the new copy replaces the old one; groups regenerated after a
        rewind are held to the trained copies by their content digest (`buffer.rewind`)."""
        current = self.versions.current()
        if current is None or current[0] < version:
            return  # never published: nothing to compare
        try:
            stored = read_state_dict(self.weights.path(version))
        except FileNotFoundError:
            return  # pruned: no generator can load it any more
        differing = [
            name
            for name, tensor in stored.items()
            if name not in snapshot or not torch.equal(snapshot[name], tensor)
        ]
        if differing:
            print(
                f"{REPLAY_MISMATCH} {version}: {len(differing)} of {len(stored)} tensors differ "
                f"from its first copy (first: {differing[0]}); this resume is not bitwise (other "
                "learner ranks, threads or torch?), so later steps may differ from an "
                "uninterrupted run; generators load the new copy from now on",
                flush=True,
            )

    def publish_initial(self, *, resume: bool) -> None:
        """Write and announce v0 (rank 0): the module itself, or its gathered weights when
        sharded. A fresh run's registry is empty (anything else is a bug); a resumed learner
        killed before its first checkpoint may already have published it."""
        initial = self.policy if self._initial is None else self._initial
        location = self.weights.write(0, initial, config_dir=self.model_dir)
        if resume:
            publish_unless_done(self.versions, 0, location)
        else:
            self.versions.publish(0, location)

    def forget_initial(self) -> None:
        """A resumed learner publishes no v0: free the gathered copy."""
        self._initial = None


def versions_to_keep(cfg: LearnerConfig, lag: int) -> int:
    """Versions the weight store keeps. A resumed learner restarts at a checkpoint: its newest
    one, or the one before when the newest is damaged (fixed mode then rewinds and regenerates
    the groups trained since, `buffer.rewind`). Generators may then need versions back to
    (that checkpoint - lag + 1), so keep two checkpoint intervals of versions plus the lag (the
    oldest a trained group may have: `LearnerTask.max_lag`)."""
    return max(cfg.keep_versions, lag + 2 * cfg.checkpoint_every + 2)


def publish_unless_done(versions: VersionPublisher, version: int, location: str) -> None:
    """Publish `version`, unless a run killed after its last checkpoint already did.

    A resumed learner redoes the steps after its checkpoint and rewrites their weights into the
    same weight-store directories; the registry never moves backwards, and in fixed mode the
    redone weights are bitwise the ones already published, so there is nothing to announce.
    """
    current = versions.current()
    if current is None or current[0] < version:
        versions.publish(version, location)
