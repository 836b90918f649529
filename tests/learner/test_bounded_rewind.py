"""Bounded mode resumes past a damaged checkpoint or step file (issue 41), on a real redis-server.

Bounded mode cannot replay: what it trained after a checkpoint depended on timing. A resume that
falls back to an older checkpoint therefore *rewinds* the run (`learner.runtime.resume.
bounded_rewind`): the versions published after the checkpoint are withdrawn (`buffer.timeline`),
the groups committed after it are lost with the steps that trained them (recorded, counted) and
their prompts made again, and training continues from the checkpoint. Each test trains its own
4-step run (checkpoints at 2 and 4, every group pushed up front at version 0, max lag 4),
damages it, and resumes while a thread does what the run's generators would: claim the reissued
tickets and push new samples made by the registry's current version.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from buffer.connection import RunKeys
from buffer.consumer import RolloutConsumer
from buffer.producer import RolloutProducer
from buffer.run_control import clear_stop
from buffer.telemetry import DEAD_LETTER, LOST_TO_REWIND
from buffer.tickets import TicketDispenser
from buffer.versions import VersionRegistry
from contract import metrics as M
from contract.trial import TrialStatus
from learner.config import LearnerConfig, make_arm
from learner.runtime.loop import LearnerOutcome
from learner.runtime.metrics_log import GroupLedger, MetricsLog
from tests.learner.learner_runs import fixed_task, pushed_group, run_on_redis
from tests.learner.tiny import save_tiny_policy

SEED, PER_STEP, GROUP_SIZE, STEPS = 5, 2, 4, 4


def _run(
    client, model_dir: Path, trial: Path, run: str, *, resume: bool, push: bool
) -> LearnerOutcome:
    if push:  # every group of the run at version 0: bounded mode at max lag 4 trains them all
        producer = RolloutProducer(client, run)
        for prompt in range(STEPS * PER_STEP):
            batch = prompt // PER_STEP
            group = pushed_group(
                run, SEED, batch=batch, prompt=prompt, version=0, group_size=GROUP_SIZE,
                draw=prompt,
            )  # fmt: skip
            producer.push(group, batch_index=batch)
    task = fixed_task(
        make_arm(name="grpo", objective="grpo"),
        LearnerConfig(steps=STEPS, prompts_per_step=PER_STEP, checkpoint_every=2),
        seed=SEED,
        group_size=GROUP_SIZE,
        model_dir=model_dir,
        trial_dir=trial,
        take_timeout_s=10,
    )
    task = dataclasses.replace(task, mode="bounded", lag=STEPS)
    return run_on_redis(task, client, run, weights_dir=trial / "weights", resume=resume)


def _finished_run(redis_server, tmp_path: Path, run: str) -> tuple[object, Path, Path]:
    client = redis_server.client()
    model_dir = save_tiny_policy(tmp_path / "model")
    trial = tmp_path / "trial"
    outcome = _run(client, model_dir, trial, run, resume=False, push=True)
    assert outcome.status == TrialStatus.COMPLETED and outcome.steps_completed == STEPS
    assert VersionRegistry(client, run).latest() == STEPS
    client.set(RunKeys(run).ticket_next, STEPS * PER_STEP)  # as the run's generators left it
    return client, model_dir, trial


def _step_files(trial: Path) -> dict[str, bytes]:
    return {
        f"{sub}/{path.name}": path.read_bytes()
        for sub in ("metrics.parquet", "evals.parquet", "rollouts.parquet", "trained_groups")
        for path in sorted((trial / sub).glob("*"))
    }


class _Generator(threading.Thread):
    """What a generator does after a rewind: claim the reissued tickets and push new samples
    made by the registry's current version, tagged with the run's timeline. With `stale_first`
    its first push is one a generator that loaded v3 before the rewind would make: version 3,
    timeline 0 (the learner must drop it, count it, and reissue its ticket)."""

    def __init__(self, client, run: str, pushes: int, *, stale_first: bool = False) -> None:
        super().__init__(daemon=True)
        self.client, self.run_id, self.pushes, self.stale_first = client, run, pushes, stale_first
        self.failure: BaseException | None = None
        self.versions: list[int] = []

    def run(self) -> None:
        try:
            self._generate()
        except BaseException as error:  # reported by the test thread
            self.failure = error

    def _generate(self) -> None:
        keys, registry = RunKeys(self.run_id), VersionRegistry(self.client, self.run_id)
        dispenser = TicketDispenser(self.client, self.run_id)
        producer = RolloutProducer(self.client, self.run_id)
        deadline = time.monotonic() + 20
        while not self.client.zrangebyscore(keys.ticket_leases, 0, 0):  # until the rewind
            if time.monotonic() > deadline:
                raise TimeoutError("no ticket was reissued")
            time.sleep(0.01)
        stale = self.stale_first
        while len(self.versions) < self.pushes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"pushed {len(self.versions)} of {self.pushes}")
            timeline = registry.timeline().number  # read before the version, as generators do
            version = registry.latest()
            ticket = dispenser.claim("gen-test", limit=STEPS * PER_STEP)
            if ticket is None:
                time.sleep(0.02)
                continue
            batch = ticket // PER_STEP
            if stale:
                version, timeline, stale = 3, 0, False
            else:
                self.versions.append(version)
            group = pushed_group(
                self.run_id, SEED, batch=batch, prompt=ticket, version=version,
                group_size=GROUP_SIZE, draw=1000 + ticket + 100 * len(self.versions),
            )  # fmt: skip
            producer.push_many([group], batch_index=batch, tickets=[ticket], timeline=timeline)


def _resume_with_generator(
    client, model_dir: Path, trial: Path, run: str, *, stale_first: bool = False
) -> tuple[LearnerOutcome, _Generator]:
    clear_stop(client, run)  # as the supervisor does when it restarts a trial
    generator = _Generator(client, run, pushes=2 * PER_STEP, stale_first=stale_first)
    generator.start()
    outcome = _run(client, model_dir, trial, run, resume=True, push=False)
    generator.join(timeout=20)
    assert generator.failure is None, generator.failure
    return outcome, generator


def _assert_rewound_and_completed(
    client, trial: Path, run: str, outcome, kept: dict, *, ledger_lost: bool = False
) -> None:
    """Completed from checkpoint 2: the 4 groups of steps 3-4 lost (recorded, counted once) and
    retrained as new samples of the same prompts; versions 3-4 withdrawn and published again.
    `ledger_lost`: step 3's ledger file was gone, so its groups are recorded by id alone."""
    assert outcome.status == TrialStatus.COMPLETED and outcome.steps_completed == STEPS
    ledger = GroupLedger(trial).read()
    ids = [row["group_id"] for row in ledger]
    assert len(ids) == len(set(ids)) == STEPS * PER_STEP  # each prompt trained once
    assert [row["step"] for row in ledger] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert all(row["policy_version"] >= 2 for row in ledger if row["step"] > 2)
    lost = GroupLedger(trial).lost()
    assert sorted(row["group_id"] for row in lost) == sorted(ids[2 * PER_STEP :])
    with_rows = [row for row in lost if "trained_at_step" in row]
    assert {row["trained_at_step"] for row in with_rows} == ({4} if ledger_lost else {3, 4})
    assert len(with_rows) == (PER_STEP if ledger_lost else 2 * PER_STEP)
    assert {row["rewound_to_step"] for row in lost} == {2}
    assert all(row["policy_version"] == 0 for row in with_rows)  # what the lost steps trained
    rows = MetricsLog(trial).read().to_pandas().set_index("step")
    assert rows[M.REWIND_LOST_GROUPS].loc[3] == 2 * PER_STEP
    assert rows[M.REWIND_WITHDRAWN_VERSIONS].loc[3] == 2
    assert rows[M.REWIND_LOST_GROUPS].loc[[1, 2, 4]].isna().all()
    assert {name: data for name, data in _step_files(trial).items() if name in kept} == kept
    registry = VersionRegistry(client, run)
    assert registry.timeline().rewinds == (2,) and registry.latest() == STEPS
    keys = RunKeys(run)
    assert client.scard(keys.trained) == STEPS * PER_STEP and client.xlen(keys.stream) == 0
    assert client.zcard(keys.ticket_leases) == 0


@pytest.mark.parametrize("damage", ["checkpoint", "step file", "ledger file"])
def test_bounded_resume_past_damage_rewinds_and_continues(
    redis_server, tmp_path: Path, capsys, damage: str
) -> None:
    """The newest checkpoint's state deleted, or a step file it vouches for damaged: the resume
    falls back to checkpoint 2 and continues (it used to fail for good, "... cannot be
    retrained in bounded mode"). A group made from withdrawn weights (v3 loaded before the
    rewind) is dropped, counted and its prompt made again; nothing is dead-lettered."""
    run = f"bounded-{damage.replace(' ', '-')}"
    client, model_dir, trial = _finished_run(redis_server, tmp_path, run)
    if damage == "checkpoint":
        (trial / "checkpoints/step-000004/state.pt").unlink()
    elif damage == "step file":
        part = trial / "metrics.parquet/part-000003.parquet"
        part.write_bytes(part.read_bytes()[:-9] + b"x" * 9)
    else:  # step 3's ledger file gone: its groups are recorded lost by id alone
        (trial / "trained_groups/step-000003.json").unlink()
    kept = {n: d for n, d in _step_files(trial).items() if n.endswith(("000001.json", "0002.json"))}
    outcome, generator = _resume_with_generator(client, model_dir, trial, run, stale_first=True)
    _assert_rewound_and_completed(
        client, trial, run, outcome, kept, ledger_lost=damage == "ledger file"
    )
    assert generator.versions[0] == 2  # the first new sample came from the checkpoint's weights
    rows = MetricsLog(trial).read().to_pandas().set_index("step")
    assert rows[M.REWIND_WITHDRAWN_GROUPS].sum() == 1
    counters = {k.decode(): int(v) for k, v in client.hgetall(RunKeys(run).counters).items()}
    assert counters.get(LOST_TO_REWIND) == 1 and counters.get(DEAD_LETTER, 0) == 0
    said = capsys.readouterr().out
    assert "rewinding to checkpoint step-000002 (bounded mode, which cannot replay)" in said
    assert "v3-v4 withdrawn" in said and "4 group(s)" in said and "batches 2-3" in said


class _KilledAfterRewind(BaseException):
    """A learner dying right after its Redis rewind, before it touched a step file."""


def test_a_bounded_learner_killed_right_after_its_rewind_resumes_again(
    redis_server, tmp_path: Path, monkeypatch, capsys
) -> None:
    """The lost groups are recorded before the rewind script, and step files truncated only
    after it: a learner killed right after the script leaves the files as they were and the
    record written. The next resume finds nothing more to rewind, still counts the lost groups
    on its first step (the checkpoint's timeline is older than the run's), and completes."""
    run = "bounded-killed-rewind"
    client, model_dir, trial = _finished_run(redis_server, tmp_path, run)
    (trial / "checkpoints/step-000004/state.pt").unlink()
    before = _step_files(trial)
    rewind = RolloutConsumer.rewind_bounded

    def rewind_then_die(self, group_ids, to_version):
        rewind(self, group_ids, to_version)
        raise _KilledAfterRewind

    monkeypatch.setattr(RolloutConsumer, "rewind_bounded", rewind_then_die)
    clear_stop(client, run)
    with pytest.raises(_KilledAfterRewind):
        _run(client, model_dir, trial, run, resume=True, push=False)
    after = _step_files(trial)
    assert {n: d for n, d in after.items() if n in before} == before  # nothing truncated
    assert sorted(set(after) - set(before)) == ["trained_groups/lost-001.json"]
    assert len(json.loads(after["trained_groups/lost-001.json"])) == 2 * PER_STEP
    assert VersionRegistry(client, run).timeline().rewinds == (2,)
    monkeypatch.undo()
    capsys.readouterr()

    kept = {n: d for n, d in before.items() if n.endswith(("000001.json", "0002.json"))}
    outcome, _generator = _resume_with_generator(client, model_dir, trial, run)
    _assert_rewound_and_completed(client, trial, run, outcome, kept)
    assert "rewinding" not in capsys.readouterr().out  # nothing more to rewind


def test_a_plain_bounded_resume_withdraws_versions_published_after_its_checkpoint(
    redis_server, tmp_path: Path
) -> None:
    """A learner killed between checkpoints (here: the step-4 checkpoint removed whole, as if
    the kill came before it) published v3 and v4 that the resumed learner will publish again
    with other weights: they are withdrawn, and no group is lost (none was committed)."""
    run = "bounded-plain"
    client, model_dir, trial = _finished_run(redis_server, tmp_path, run)
    shutil.rmtree(trial / "checkpoints/step-000004")
    keys = RunKeys(run)
    # The step-4 commit never happened: batches 2-3 are pending again, as after such a kill.
    client.delete(keys.trained)
    client.sadd(keys.trained, *[f"s{SEED}-b{p // PER_STEP}-p{p}" for p in range(2 * PER_STEP)])
    producer = RolloutProducer(client, run)
    for prompt in range(2 * PER_STEP, STEPS * PER_STEP):
        batch = prompt // PER_STEP
        group = pushed_group(
            run, SEED, batch=batch, prompt=prompt, version=0, group_size=GROUP_SIZE, draw=prompt
        )
        client.delete(keys.digest(group.group_id))
        producer.push(group, batch_index=batch)
    clear_stop(client, run)
    outcome = _run(client, model_dir, trial, run, resume=True, push=False)
    assert outcome.status == TrialStatus.COMPLETED and outcome.steps_completed == STEPS
    rows = MetricsLog(trial).read().to_pandas().set_index("step")
    assert rows[M.REWIND_LOST_GROUPS].loc[3] == 0 and rows[M.REWIND_WITHDRAWN_VERSIONS].loc[3] == 2
    assert GroupLedger(trial).lost() == []
    assert VersionRegistry(client, run).timeline().rewinds == (2,)
