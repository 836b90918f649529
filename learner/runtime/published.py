"""The policy as the generators and the evals see it: full weights of each version, written to
the weight store and announced in the version registry (`publish`, a `StepWriter` job).

Unsharded (a single process, or DDP): rank 0's module holds the whole policy; each version's
snapshot is a CPU copy of its state dict and the evals run on the module itself, as they always
did.

Sharded (`learner.parallel=fsdp`): no rank holds the whole policy. Every rank takes part in
gathering each version (`learner.runtime.sharding.gather_full_weights`, one tensor at a time,
kept by rank 0 in the published dtype: bf16 under `learner.dtype=bfloat16`), and rank 0 runs the
evals on a plain copy of the model loaded with that gathered version: the evals score exactly
the weights the generators load. That copy is in the published dtype and waits in host memory
between evals; it is on the learner device only while the evals run, so it costs rank 0's GPU
one unsharded model (in bf16 under bf16) during the evals and nothing during training.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from buffer.streams import VersionPublisher, WeightWriter
from learner.config import LearnerConfig
from learner.runtime.distributed import DistContext
from learner.runtime.models import load_causal_lm
from learner.runtime.sharding import DTYPES, gather_full_weights, is_sharded
from learner.runtime.step import StepModels
from learner.runtime.step_io import weight_snapshot


class PublishedWeights:
    """Snapshots of the policy, their publication (rank 0), and the module the evals run on.

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
    ) -> None:
        self.policy = models.policy.module
        self.weights, self.versions, self.keep = weights, versions, keep
        self.sharded = is_sharded(self.policy)
        self.dist = dist
        self.dtype = DTYPES[cfg.dtype]
        self.model_dir, self.device = model_dir, cfg.device
        self._eval_copy: nn.Module | None = None
        # Sharded: v0 is gathered now, by every rank together (a fresh run publishes it; a
        # resume drops it unused, `forget_initial`).
        self._initial = self.snapshot() if self.sharded else None

    def snapshot(self) -> dict[str, torch.Tensor]:
        """This version's full weights on rank 0's CPU (empty on the other ranks). Sharded:
        every rank must call it together."""
        if self.sharded:
            return gather_full_weights(self.policy, self.dist, self.dtype)
        return weight_snapshot(self.policy) if self.dist.is_main else {}

    def publish(self, version: int, snapshot: dict[str, torch.Tensor]) -> None:
        """Write `version`'s weights, announce it, prune old versions (a `StepWriter` job)."""
        location = self.weights.write(version, snapshot, config_dir=self.model_dir)
        publish_unless_done(self.versions, version, location)
        self.weights.prune(keep=self.keep, protect={0})

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

    @contextmanager
    def eval_model(self, snapshot: dict[str, torch.Tensor] | None = None) -> Iterator[nn.Module]:
        """The module the evals run on (rank 0), for the `with` block: the policy itself, or,
        sharded, the plain copy loaded with `snapshot` (v0 when None), on the learner device
        until the block ends and back in host memory after."""
        if not self.sharded:
            yield self.policy
            return
        weights = snapshot if snapshot is not None else self._initial
        assert weights, "a sharded learner evaluates gathered weights: pass the step's snapshot"
        if self._eval_copy is None:
            self._eval_copy = load_causal_lm(self.model_dir, "cpu").to(self.dtype).eval()
        self._eval_copy.load_state_dict(weights)
        try:
            yield self._eval_copy.to(self.device)
        finally:
            self._eval_copy.to("cpu")


def versions_to_keep(cfg: LearnerConfig, lag: int) -> int:
    """Versions the weight store keeps. A resumed learner restarts at its checkpoint; generators
    may then need versions back to (checkpoint - lag), so keep every version since the last
    checkpoint, plus the lag."""
    return max(cfg.keep_versions, lag + cfg.checkpoint_every + 2)


def publish_unless_done(versions: VersionPublisher, version: int, location: str) -> None:
    """Publish `version`, unless a run killed after its last checkpoint already did.

    A resumed learner redoes the steps after its checkpoint and rewrites their weights into the
    same weight-store directories; the registry never moves backwards, and in fixed mode the
    redone weights are bitwise the ones already published, so there is nothing to announce.
    """
    current = versions.current()
    if current is None or current[0] < version:
        versions.publish(version, location)
