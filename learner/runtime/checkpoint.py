"""Checkpoints that make a killed trial resumable bit for bit.

A checkpoint holds everything the next step's arithmetic depends on: policy (and value model)
weights, optimiser and scheduler state, the RNG states of torch, numpy and python, the step, and
the ids of groups already trained (so redelivered groups are skipped: exactly-once training,
design section 9).

Saving: `state.pt` is written to a temporary directory, fsynced and renamed to `step-NNNNNN/`;
then `manifest.json` is written into it (temporary name, fsync, rename, fsync of the directory),
then `latest.json` is replaced atomically (`contract.durable`), then old checkpoints are pruned.
The manifest (`contract.checkpoint_manifest`) is the checkpoint's seal: a directory without a
valid one is incomplete (a kill mid-save) and never loaded.

`files`: every file of the checkpoint directory with its size and sha256. `records`: the trial's
per-step files of steps <= the checkpoint's (metric, eval and rollout-log parts, ledger files;
names relative to the trial directory, `learner.runtime.records.StepRecords.vouched`), which the
learner flushed before saving; the checkpoint vouches for them.

Sharded (`learner.parallel=fsdp`): the models and optimisers are not in `state.pt` but in
`step-NNNNNN/shards/`, written by every rank together with torch.distributed.checkpoint
(`learner.runtime.sharded_checkpoint`); `state.pt` keeps the schedulers, RNG states and training
state, and the manifest lists the shard files too, so a damaged shard makes the checkpoint not
intact like a damaged `state.pt`. Every rank scans and verifies the same directories, so all pick
the same checkpoint; loading reshards to the resumed learner's number of ranks. A sharded
checkpoint cannot be loaded by an unsharded learner or the other way round (one line).

Resuming: `latest.json` is a hint, not the record. `load` scans the `step-*` directories newest
first, skips each one whose manifest is missing or invalid or whose files are missing or differ
from their digests (saying why, one line each), and loads the newest intact one (saying which).
The steps after it are retrained from the groups Redis still holds pending: a fallback past a
checkpoint whose groups were already committed cannot get them back, so the resume fails at once
in one line (`resume.settle_resumed_commits` compares Redis's trained ids with the checkpoint's)
instead of waiting for them until `take_timeout_s`. With none intact
it raises `ResumeError` (one line) rather than start over: a fresh start would delete the
trial's rows, and Redis no longer holds the groups the checkpoints committed.
`verify_records` then checks the step files the loaded checkpoint vouches for. A missing or
damaged one cannot be rebuilt: a checkpoint holds the training state, not the metric rows, eval
scores or ledger rows of past steps (keeping them would make every checkpoint grow with the run),
and those steps' groups are gone from Redis, so they cannot be replayed either. The resume then
fails with one `ResumeError` line naming the file, its step and the checkpoint's step range;
nothing is deleted before that check and the load have passed (the caller truncates rows newer
than the checkpoint only afterwards). Loading uses `torch.load(weights_only=True)`: these files
are our own, but nothing here ever executes pickled code.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError

from contract.checkpoint_manifest import (
    MANIFEST,
    MANIFEST_FORMAT,
    CheckpointManifest,
    CheckpointSeal,
    ManifestFile,
    ManifestRecord,
    is_inside,
    manifest_bytes,
)
from contract.durable import file_digest, fsync_dir, fsync_tree, write_atomic
from learner.runtime import sharded_checkpoint
from learner.runtime.distributed import SINGLE, DistContext, barrier

STATE_FILE = "state.pt"
_STEP_DIR = re.compile(r"^step-(\d{6,})$")

# The per-step files a checkpoint of step k vouches for, given k: {name relative to the trial
# directory: (its step, its path)} (`learner.runtime.records.StepRecords.vouched`).
Records = Callable[[int], Mapping[str, tuple[int, Path]]]


class ResumeError(RuntimeError):
    """A resume that cannot go on without losing or inventing data; the message is one line."""


@dataclass
class TrainingState:
    """The learner's mutable state besides module weights."""

    step: int = 0
    updates: int = 0
    trained_group_ids: list[str] = field(default_factory=list)
    grad_norm_history: list[float] = field(default_factory=list)
    grad_spikes: int = 0
    # Fixed mode: group id -> why its slot can never be filled (buffer.intake); a
    # resumed learner fails with that line at once instead of waiting for the group.
    refused_slots: dict[str, str] = field(default_factory=dict)
    # Bounded mode: the run's timeline number (`buffer.timeline`) when this state was saved; a
    # resume counts the groups lost to rewinds after it (`learner.runtime.resume`).
    timeline: int = 0


def capture_rng() -> dict[str, Any]:
    np_state = np.random.get_state()  # noqa: NPY002 - the global RNG is what libraries use
    return {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
    }


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    restored = (kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached)
    np.random.set_state(restored)  # noqa: NPY002
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


class CheckpointStore:
    """`<trial>/checkpoints/step-NNNNNN/` directories, each sealed by its `manifest.json`, plus
    an atomically replaced `latest.json` (a hint: loading scans the directories).

    `records`: the per-step files each checkpoint vouches for (see the module docstring)."""

    def __init__(self, root: Path, keep: int = 2, records: Records | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.records = records
        self._digests: dict[Path, tuple[int, int, str]] = {}  # path: (size, mtime_ns, sha256)

    def steps(self) -> list[int]:
        """Steps with a checkpoint directory, intact or not, newest first."""
        found = (_STEP_DIR.match(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def has_checkpoints(self) -> bool:
        """Whether a checkpoint was ever completed here: `latest.json` exists or a directory has
        a manifest (intact or not). False only for a trial that never finished a save."""
        if (self.root / "latest.json").exists():
            return True
        return any((self._dir(step) / MANIFEST).exists() for step in self.steps())

    def latest_step(self) -> int | None:
        """The step of the newest intact checkpoint (verified against its manifest), or None."""
        return next((step for step in self.steps() if self._problem(step) is None), None)

    def save(
        self, state: TrainingState, modules: dict[str, Any], dist: DistContext = SINGLE
    ) -> Path:
        """Write modules' state dicts (models, optimisers, schedulers) and `state` for a step.

        Sharded modules (FSDP, `learner.runtime.sharding`): every rank calls this together and
        writes its shards (`sharded_checkpoint`); rank 0 alone writes the rest and the seal.
        Otherwise rank 0 alone calls it.
        """
        final = self.root / f"step-{state.step:06d}"
        tmp = self.root / f".tmp-step-{state.step:06d}"
        sharded = sharded_checkpoint.is_sharded_payload(modules)
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        payload: dict[str, Any] = {}
        if sharded:
            barrier(dist)  # the directory exists before any rank writes into it
            sharded_checkpoint.save_shards(modules, tmp / sharded_checkpoint.SHARDS_DIR)
            barrier(dist)  # every rank's shards are written
            payload = sharded_checkpoint.unsharded_state(modules)
        else:
            payload = {name: module.state_dict() for name, module in modules.items()}
        if not dist.is_main:
            barrier(dist)  # rank 0 seals the checkpoint
            return final
        payload["rng"] = capture_rng()
        payload["training_state"] = {
            "step": state.step,
            "updates": state.updates,
            "trained_group_ids": list(state.trained_group_ids),
            "grad_norm_history": list(state.grad_norm_history),
            "grad_spikes": state.grad_spikes,
            "refused_slots": dict(state.refused_slots),
        }
        torch.save(payload, tmp / STATE_FILE)
        fsync_tree(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        fsync_dir(self.root)
        manifest = self._build_manifest(final, state.step)
        write_atomic(final / MANIFEST, manifest_bytes(manifest))  # the seal: last in the directory
        latest = {"step": state.step, "dir": final.name}
        write_atomic(self.root / "latest.json", json.dumps(latest).encode())
        self._prune(state.step)
        if sharded:
            barrier(dist)
        return final

    def newest_usable(self, base: Path, *, say: Callable[[str], None] | None = None) -> int | None:
        """The step of the newest checkpoint that is intact and whose step files (relative to
        `base`, the trial directory) are all there and undamaged, or None when none is: a
        fixed-mode resume rewinds to it and replays the steps after it (`learner.runtime.
        resume`), so a damaged file costs the steps since the checkpoint before it. `say` gets
        one line per newer checkpoint passed over, and why."""
        say = say or (lambda _line: None)
        for step in self.steps():
            problem = self._problem(step) or self._records_problem(step, base)
            if problem is None:
                return step
            say(f"checkpoint {self._dir(step).name} passed over: {problem}")
        return None

    def load(
        self,
        modules: dict[str, Any],
        *,
        say: Callable[[str], None] | None = None,
        step: int | None = None,
    ) -> TrainingState:
        """Restore modules and RNG states in place from the newest intact checkpoint, or from
        checkpoint `step` (which must be intact: `newest_usable` chose it).

        `say` gets one line per newer checkpoint skipped (why) and one naming the checkpoint
        used. Raises `ResumeError` (one line) when no checkpoint is intact.
        """
        say = say or (lambda _line: None)
        if step is None:
            step = self._newest_intact(say)
        elif (problem := self._problem(step)) is not None:
            raise ResumeError(f"checkpoint {self._dir(step).name}: {problem}")
        say(f"resuming from checkpoint {self._dir(step).name}{self._pointer_note(step)}")
        payload = torch.load(self._dir(step) / STATE_FILE, weights_only=True)
        shards = self._dir(step) / sharded_checkpoint.SHARDS_DIR
        sharded = sharded_checkpoint.is_sharded_payload(modules)
        if sharded != shards.is_dir():
            kinds = ("sharded (learner.parallel=fsdp)", "whole (learner.parallel=ddp)")
            raise ResumeError(
                f"checkpoint {self._dir(step).name} is {kinds[not shards.is_dir()]}, this "
                f"learner's models are {kinds[not sharded]}; resume with the learner.parallel "
                "the trial ran with"
            )
        if sharded:  # every rank together; the shards are resharded to this world size
            sharded_checkpoint.load_shards(modules, shards)
            sharded_checkpoint.load_unsharded_state(modules, payload)
        else:
            for name, module in modules.items():
                module.load_state_dict(payload[name])
        restore_rng(payload["rng"])
        return TrainingState(**payload["training_state"])

    def _newest_intact(self, say: Callable[[str], None]) -> int:
        """The newest checkpoint that is intact (one line per newer one skipped, and why), or
        ResumeError (one line) when none is."""
        skipped: list[str] = []
        for step in self.steps():
            problem = self._problem(step)
            if problem is None:
                return step
            skipped.append(f"{self._dir(step).name}: {problem}")
            say(f"checkpoint {self._dir(step).name} skipped: {problem}")
        found = "; ".join(skipped) if skipped else "no checkpoint directory"
        raise ResumeError(
            f"no intact checkpoint in {self.root} ({found}); restore one, or rerun the trial "
            "without --resume"
        )

    def verify_records(self, step: int, base: Path) -> None:
        """Check the per-step files checkpoint `step` vouches for, relative to `base` (the trial
        directory). Raises `ResumeError` (one line) naming the first missing or damaged one, its
        step and the checkpoint's step range: they cannot be rebuilt from the checkpoint (module
        docstring); a fixed-mode resume rebuilds them by replaying from an older one instead
        (`newest_usable`)."""
        problem = self._records_problem(step, base)
        if problem is not None:
            raise ResumeError(
                f"cannot resume from checkpoint {self._dir(step).name} (steps 0-{step}): "
                f"{problem}; a checkpoint holds no rows to rebuild it from, so restore the file "
                "from a copy (or the bucket), or rerun the trial without --resume"
            )

    def _records_problem(self, step: int, base: Path) -> str | None:
        """What is wrong with the step files checkpoint `step` vouches for (the first missing or
        damaged one, and how many more), or None when they are all there and intact."""
        try:
            records = CheckpointManifest.model_validate(self._manifest(step)).records
        except ValidationError:
            return f"{self._dir(step) / MANIFEST}: its records are not valid"
        problems = []
        for name, record in sorted(records.items(), key=lambda item: (item[1].step, item[0])):
            path = Path(base) / name
            if not is_inside(name) or not path.is_file():
                problems.append((record.step, name, "missing"))
            elif self._record_digest(path) != record.sha256:
                problems.append((record.step, name, "damaged"))
        if not problems:
            return None
        first_step, name, what = problems[0]
        more = ""
        if len(problems) > 1:
            lo, hi = min(s for s, _, _ in problems), max(s for s, _, _ in problems)
            more = f" ({len(problems)} files of steps {lo}-{hi} are missing or damaged)"
        return f"{name} (step {first_step}) is {what}{more}"

    def _dir(self, step: int) -> Path:
        return self.root / f"step-{step:06d}"

    def _manifest(self, step: int) -> object:
        return json.loads((self._dir(step) / MANIFEST).read_text())

    def _build_manifest(self, final: Path, step: int) -> CheckpointManifest:
        """The manifest of the checkpoint just renamed to `final`: its files and the trial's
        step files it vouches for."""
        files = {
            path.relative_to(final).as_posix(): ManifestFile(
                sha256=file_digest(path), bytes=path.stat().st_size
            )
            for path in sorted(final.rglob("*"))
            if path.is_file()
        }
        records = self.records(step) if self.records is not None else {}
        return CheckpointManifest(
            format=MANIFEST_FORMAT,
            step=step,
            files=files,
            records={
                name: ManifestRecord(step=record_step, sha256=self._record_digest(path))
                for name, (record_step, path) in sorted(records.items())
            },
        )

    def _problem(self, step: int) -> str | None:
        """Why checkpoint `step` is not intact, in a few words, or None if it is."""
        directory = self._dir(step)
        if not (directory / MANIFEST).is_file():
            return f"it has no {MANIFEST} (its save did not finish, or the manifest was lost)"
        try:
            raw = self._manifest(step)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"{MANIFEST} is unreadable ({exc})"
        try:
            seal = CheckpointSeal.model_validate(raw)
        except ValidationError:
            seal = None
        if seal is None or seal.step != step or STATE_FILE not in seal.files:
            return f"{MANIFEST} is not a valid {MANIFEST_FORMAT} manifest of step {step}"
        for name, entry in sorted(seal.files.items()):
            path = directory / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != entry.bytes:
                return (
                    f"{name} is damaged ({path.stat().st_size} bytes, its manifest says "
                    f"{entry.bytes})"
                )
            if file_digest(path) != entry.sha256:
                return f"{name} is damaged (its sha256 differs from the manifest's)"
        return None

    def _pointer_note(self, step: int) -> str:
        pointer = self.root / "latest.json"
        if not pointer.exists():
            return " (latest.json is missing; found by scanning the checkpoint directories)"
        try:
            named = int(json.loads(pointer.read_text())["step"])
        except (OSError, ValueError, TypeError, KeyError) as exc:
            return f" (latest.json is unreadable: {exc}; found by scanning)"
        return "" if named == step else f" (latest.json names step-{named:06d})"

    def _record_digest(self, path: Path) -> str:
        """sha256 of a step file, hashed once per (size, mtime) in this process."""
        stat = path.stat()
        cached = self._digests.get(path)
        if cached is not None and cached[:2] == (stat.st_size, stat.st_mtime_ns):
            return cached[2]
        digest = file_digest(path)
        self._digests[path] = (stat.st_size, stat.st_mtime_ns, digest)
        return digest

    def _prune(self, newest: int) -> None:
        """Keep the `keep` newest checkpoints up to `newest`, the one just saved. Newer ones (left
        behind by a resume that skipped them) neither count nor go."""
        steps = sorted(step for step in self.steps() if step <= newest)
        for old in steps[: max(0, len(steps) - self.keep)]:
            shutil.rmtree(self._dir(old), ignore_errors=True)
