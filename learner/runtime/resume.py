"""Exactly-once training across restarts: where a learner starts (`start_or_resume`) and how a
step is committed (`Commits`), the two halves of one protocol.

A step is *committed* at a checkpoint: the checkpoint is written first, then the groups trained
since the previous checkpoint are marked trained and acknowledged in Redis. A learner killed
between the two finds those groups still pending under its consumer name, resumes from the
checkpoint, which names them as trained, and commits them then (`settle_resumed_commits`); one
killed between two checkpoints retrains the groups after its checkpoint identically (fixed mode
is bitwise reproducible). A group is never trained twice across commits.

Resuming loads the newest intact checkpoint (weights, optimisers, schedulers, RNG states and the
`TrainingState`), checks the step files it vouches for, squares Redis with it and only then
drops the step records newer than it. In fixed mode it loads the newest checkpoint that is
intact *and* whose step files are, and rewinds Redis to it (`settle_resumed_commits`): a damaged
checkpoint or step file costs the steps since the checkpoint before it, replayed bitwise (a
republished version is compared with its stored copy, `PublishedWeights._check_replay`).
Bounded mode falls back the same way, but cannot replay: the resume rewinds the run to the
checkpoint (`bounded_rewind`): the versions after it are withdrawn (`buffer.timeline`: groups
made from them are dropped and counted as they are met, their prompts made again), the groups
committed after it are lost with the steps that trained them (recorded in the ledger's
`lost-NNN.json` and counted in the first step's `rewind/lost_groups`) and their prompts become
fresh work; training continues from the checkpoint.
A learner with no checkpoint starts from the initial weights: it publishes v0 and logs step 0's
evals (run by a generator, as every eval).
"""

from __future__ import annotations

import json
import re
import time
from functools import partial
from typing import NamedTuple

from buffer.streams import Delivery
from buffer.timeline import Timeline
from contract import metrics as M
from contract.layout import TrialPaths
from learner.runtime.checkpoint import CheckpointStore, TrainingState
from learner.runtime.distributed import DistContext
from learner.runtime.models import checkpoint_modules
from learner.runtime.published import PublishedWeights, versions_to_keep
from learner.runtime.records import StepRecords
from learner.runtime.step import StepModels
from learner.runtime.task import LearnerPorts, LearnerTask


class Commits:
    """The groups consumed since the last checkpoint, and the commit that settles them."""

    def __init__(
        self, checkpoints: CheckpointStore, modules: dict[str, object], ports: LearnerPorts,
        dist: DistContext,
    ) -> None:  # fmt: skip
        self.checkpoints, self.modules, self.ports, self.dist = checkpoints, modules, ports, dist
        self.pending: list[Delivery] = []  # consumed since the last checkpoint

    def add(self, consumed: list[Delivery]) -> None:
        """Groups a step consumed (trained or filtered): settled at the next checkpoint."""
        self.pending += consumed

    def commit(self, state: TrainingState) -> None:
        """Checkpoint first, then mark trained and ack: a kill in between only causes a retrain
        that the checkpoint's trained ids already exclude. (Sharded, the other ranks call
        `save_shards` at the same step.)"""
        self.checkpoints.save(state, self.modules, self.dist)
        if self.pending:
            commit_groups(self.ports, self.pending)
            self.pending.clear()

    def save_shards(self, state: TrainingState) -> None:
        """A rank > 0's part of a sharded checkpoint: its own shards."""
        self.checkpoints.save(state, self.modules, self.dist)


class Start(NamedTuple):
    """Where the loop starts: the state to continue from and what each step goes through;
    bounded mode's rank 0 also gets the run's timeline (what its takes drop as withdrawn) and
    the rewind this resume made, for the first step's metrics."""

    state: TrainingState
    published: PublishedWeights
    records: StepRecords
    commits: Commits
    timeline: Timeline | None = None
    rewind: RewindReport | None = None


class RewindReport(NamedTuple):
    """What a bounded-mode resume rewound: groups trained after the checkpoint and lost with
    their steps (since the checkpoint's timeline: a resume killed before its next checkpoint
    counts them again, its metric rows being gone), and versions withdrawn now."""

    lost_groups: int
    withdrawn_versions: int

    def metrics(self) -> dict[str, float]:
        return {
            M.REWIND_LOST_GROUPS: float(self.lost_groups),
            M.REWIND_WITHDRAWN_VERSIONS: float(self.withdrawn_versions),
        }


def start_or_resume(
    task: LearnerTask,
    models: StepModels,
    ports: LearnerPorts,
    *,
    resume: bool,
    dist: DistContext,
) -> Start:
    """Restore the newest intact checkpoint (every rank), or start from the initial weights
    (rank 0 publishes v0 and logs step 0). Raises ResumeError (one line) before deleting
    anything when the checkpoint, its step files or the run's Redis do not add up."""
    modules = checkpoint_modules(models)  # unwrapped: checkpoints and weight store
    keep = versions_to_keep(task.learner, task.max_lag)
    published = PublishedWeights(
        models,
        task.learner,
        task.model_dir,
        dist,
        weights=ports.weights,
        versions=ports.versions,
        keep=keep,
        verify_replays=task.policy.replays_exactly,
    )
    buffer = ports.buffer
    records = StepRecords(task.trial_dir)
    checkpoints = CheckpointStore(TrialPaths(task.trial_dir).checkpoints, records=records.vouched)
    say = partial(print, flush=True) if dist.is_main else None
    fixed = task.policy.replays_exactly  # fixed lag: replays; bounded: withdraws
    state = TrainingState()
    # Fixed mode replays bitwise, so it may fall back past a damaged checkpoint or step file to
    # the newest checkpoint whose files are all intact (None: to the initial weights) and rewind
    # the run's Redis to it; bounded mode resumes from the newest intact checkpoint or not at all.
    chosen: int | None = None  # the checkpoint to load; None: the newest intact one
    use_checkpoint = resume and checkpoints.has_checkpoints()
    if use_checkpoint:
        chosen = checkpoints.newest_usable(task.trial_dir, say=say)
        use_checkpoint = chosen is not None
    timeline, rewind = None, None
    if use_checkpoint:
        # The chosen checkpoint (latest.json is a hint); nothing is deleted until it is loaded,
        # the step files it vouches for are checked and Redis is squared with it.
        state = checkpoints.load(modules, say=say, step=chosen)
        published.forget_initial()
        if dist.is_main:
            checkpoints.verify_records(state.step, task.trial_dir)
            start = f"checkpoint step-{state.step:06d}"
            if fixed:
                settle_resumed_commits(ports, state, start)
            else:
                timeline, rewind = bounded_rewind(ports, records, state, start)
            records.truncate_after(state.step)
    elif dist.is_main:
        # No checkpoint usable (never completed, or none intact with its files): start from
        # the initial weights. A resumed learner killed before its first checkpoint may already
        # have published v0 and later versions; fixed mode redoes those steps like any resume
        # (publish_unless_done), bounded mode withdraws them; uncommitted groups are still
        # pending. (Sharded: the other ranks gathered v0 with rank 0, `PublishedWeights`.)
        if resume and fixed:
            settle_resumed_commits(ports, state, "the initial weights")
        elif resume:
            start = "the initial weights"
            timeline, rewind = bounded_rewind(ports, records, state, start)
        records.truncate_after(-1)
        published.publish_initial(resume=resume)
        report, _seconds = ports.evals.wait(ports.evals.request(0))  # a generator runs them
        pass_rate = records.eval_pass_rate(0, report)
        records.append(0, time.time(), {M.EVAL_PASS_RATE: pass_rate, M.TOKENS_GENERATED: 0})
    if timeline is None and dist.is_main and not fixed:
        timeline = buffer.timeline()  # a fresh run's: empty, unless Redis kept an old run's
    commits = Commits(checkpoints, modules, ports, dist)
    return Start(state, published, records, commits, timeline, rewind)


def bounded_rewind(
    ports: LearnerPorts, records: StepRecords, state: TrainingState, start: str
) -> tuple[Timeline, RewindReport | None]:
    """Bounded mode's resume from `state` (`start` names it), before any step file is deleted:
    the groups Redis committed after it are lost with their steps, recorded first (the
    ledger's `lost-NNN.json`, rows from the ledger files about to be truncated where they are
    readable), then one script makes their prompts fresh work and withdraws the versions after
    it (`buffer.rewind.rewind_bounded`); one line says what was rewound. A kill anywhere in
    between resumes the same way: the file is rewritten with the same rows, the script is
    idempotent. Returns the run's timeline and, when this resume or one before it since the
    checkpoint rewound, the counts for the first step's metrics (None otherwise)."""
    buffer, versions = ports.buffer, ports.versions
    before = buffer.timeline()
    beyond = buffer.committed_beyond(set(state.trained_group_ids))
    if beyond:
        records.ledger.record_lost(before.number + 1, lost_rows(records, beyond, state.step))
    rewound = buffer.rewind_bounded(beyond, to_version=state.step)
    versions.rewound(state.step, rewound.timeline)
    withdrawn = 0 if rewound.withdrawn_from is None else rewound.withdrawn_from - state.step
    if beyond or withdrawn:
        print(f"rewinding to {start} (bounded mode, which cannot replay): " + _rewound(
            state.step, withdrawn, beyond
        ), flush=True)  # fmt: skip
    recommit_groups(ports, state.trained_group_ids)
    timeline = buffer.timeline()
    report = None
    if timeline.number > state.timeline:  # this resume rewound, or one since the checkpoint
        lost = len(records.ledger.lost(after_timeline=state.timeline))
        report = RewindReport(lost, timeline.versions_withdrawn(since=state.timeline))
    state.timeline = timeline.number
    return timeline, report


def _rewound(step: int, withdrawn: int, beyond: list[str]) -> str:
    """The rewind line's account of what was withdrawn and lost."""
    parts = []
    if withdrawn:
        span = f"v{step + 1}" if withdrawn == 1 else f"v{step + 1}-v{step + withdrawn}"
        parts.append(
            f"{span} withdrawn (groups made from them are dropped, counted in "
            "rewind/withdrawn_groups, and their prompts made again)"
        )
    if beyond:
        batches = batches_of(beyond)
        span = f" (batches {batches[0]}-{batches[-1]})" if batches else ""
        parts.append(
            f"{len(beyond)} group(s) the run's Redis committed after it{span} are lost with the "
            "steps that trained them (recorded in trained_groups/lost-*.json, counted in "
            "rewind/lost_groups) and their prompts made again"
        )
    return "; ".join(parts)


def lost_rows(records: StepRecords, group_ids: list[str], checkpoint_step: int) -> list[dict]:
    """The ledger rows of `group_ids` from the steps after `checkpoint_step` (the step that
    trained each, its version and lag), or just the id where no readable ledger file has it
    (a damaged or deleted one: what the rewind is for)."""
    found: dict[str, dict] = {}
    for step in records.ledger.steps():
        if step <= checkpoint_step:
            continue
        try:
            rows = json.loads(records.ledger.path(step).read_text())
        except (OSError, ValueError):
            continue
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict) and row.get("group_id") in group_ids:
                found[str(row["group_id"])] = {"trained_at_step": step, **row}
    return [
        {**found.get(g, {"group_id": g}), "rewound_to_step": checkpoint_step} for g in group_ids
    ]


def settle_resumed_commits(ports: LearnerPorts, state: TrainingState, start: str) -> None:
    """Fixed mode: square the run's Redis with what the loaded checkpoint says was trained,
    before a resume deletes anything (`start` names where the learner resumes from).

    Groups Redis committed as trained that the checkpoint lacks were trained after it (a resume
    that fell back past a damaged or deleted newer checkpoint, or a damaged step file). A commit
    deletes them from the stream; since the steps after the checkpoint are a deterministic
    function of it, they are rewound (`buffer.rewind`): unmarked as trained, their tickets
    reissued so the generators make them again, each admitted only as the copy that was
    trained, and the learner replays the steps after the checkpoint; one line says so. Groups
    the checkpoint has that Redis still holds were trained and not yet committed (a learner
    killed between its checkpoint and the commit): they are committed now, not read back and
    dropped as too stale."""
    buffer = ports.buffer
    beyond = buffer.committed_beyond(set(state.trained_group_ids))
    if beyond:
        batches = batches_of(beyond)
        span = f"; batches {batches[0]}-{batches[-1]}" if batches else ""
        shown = ", ".join(beyond[:3]) + (", ..." if len(beyond) > 3 else "")
        buffer.rewind(beyond)
        print(
            f"rewinding to {start}: the run's Redis committed {len(beyond)} group(s) as trained "
            f"after it ({shown}{span}); their tickets are reissued, the generators make them "
            "again (each admitted only if identical to the copy trained before) and the steps "
            f"after step {state.step} are replayed",
            flush=True,
        )
    recommit_groups(ports, state.trained_group_ids)


def commit_groups(ports: LearnerPorts, deliveries: list[Delivery]) -> None:
    """A step's commit after its checkpoint, in its two steps: the checkpoint made durable
    where a resume reads it (`LearnerPorts.before_ack`), then the groups marked trained and
    acked in one MULTI. From then on Redis never redelivers them, so a resume anywhere must
    find a checkpoint at least this new: an upload that fails leaves them pending."""
    ports.before_ack()
    ports.buffer.commit(deliveries)


def recommit_groups(ports: LearnerPorts, trained_group_ids: list[str]) -> None:
    """A resume's commit of the loaded checkpoint's groups (one a killed learner did not get
    to), after the same first step as `commit_groups`."""
    ports.before_ack()
    ports.buffer.recommit(trained_group_ids)


_BATCH_OF_ID = re.compile(r"-b(\d+)-p\d+$")


def batches_of(group_ids: list[str]) -> list[int]:
    """The prompt batches `group_ids` came from (`...-b<batch>-p<prompt>`), ascending, for the
    rewind lines; ids of another form are left out."""
    return sorted({int(m.group(1)) for m in map(_BATCH_OF_ID.search, group_ids) if m})
