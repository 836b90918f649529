"""DAPO's dynamic sampling: which groups a step trains (a pure function of the rewards), and the
learner on a real redis-server asking for extra rounds, counting what it filtered, committing
every group it read, and redoing the same steps after a kill."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from buffer.connection import RunKeys
from buffer.inbox import Delivery
from buffer.producer import RolloutProducer
from buffer.schema import make_group_id
from buffer.tickets import TicketDispenser, draw_key, round_tickets
from contract import metrics as M
from contract.trial import TrialStatus
from learner.config import LearnerConfig, make_arm
from learner.runtime.dynamic_sampling import informative, select_groups, take_dynamic
from learner.runtime.loop import LearnerTask
from learner.runtime.metrics_log import GroupLedger
from tests.learner.learner_runs import fixed_task, run_on_redis
from tests.learner.tiny import random_groups, save_tiny_policy

RUN, SEED, P, G = "dapo-run", 3, 2, 4
FLAT, MIXED = [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]


def _delivery(prompt: int, rewards: list[float], batch: int = 0) -> Delivery:
    [group] = random_groups(1, G, seed=prompt % 1000)
    group = dataclasses.replace(
        group,
        run_id=RUN,
        group_id=make_group_id(SEED, batch, prompt),
        prompt_index=prompt,
        rewards=list(rewards),
        policy_version=batch,
    )
    return Delivery(f"{prompt}-0", group, batch, batch)


def _ids(deliveries: list[Delivery]) -> list[int]:
    return [d.group.prompt_index for d in deliveries]


# ---- the selection: a pure function of the rewards ------------------------------------------


def test_a_group_is_informative_when_its_rewards_disagree() -> None:
    assert informative(_delivery(0, MIXED).group)
    assert not informative(_delivery(0, FLAT).group)
    assert not informative(_delivery(0, [0.0] * G).group)
    assert informative(_delivery(0, [0.5, 0.5, 0.5, 0.50000001]).group)  # exact comparison


def test_enough_informative_groups_in_round_zero_train_as_read() -> None:
    round0 = [_delivery(0, MIXED), _delivery(1, MIXED)]
    chosen = select_groups([round0], 2)
    assert _ids(chosen.trained) == [0, 1] and chosen.extra_rounds == 0
    assert (chosen.filtered, chosen.surplus, chosen.filled) == (0, 0, 0)


def test_uninformative_groups_are_replaced_from_the_next_round_in_order() -> None:
    round0 = [_delivery(0, FLAT), _delivery(1, MIXED)]
    r1 = round_tickets(0, 1, 2)
    round1 = [_delivery(r1[0], MIXED), _delivery(r1[1], MIXED)]
    chosen = select_groups([round0, round1], 2)
    assert _ids(chosen.trained) == [1, r1[0]]
    assert _ids(chosen.consumed) == [0, 1, *r1]
    assert (chosen.filtered, chosen.surplus, chosen.filled) == (1, 1, 0)
    assert chosen.metrics() == {
        M.SAMPLING_EXTRA_ROUNDS: 1.0,
        M.SAMPLING_GROUPS_FILTERED: 1.0,
        M.SAMPLING_GROUPS_SURPLUS: 1.0,
        M.SAMPLING_GROUPS_FILLED: 0.0,
    }


def test_at_the_cap_the_batch_is_completed_with_the_earliest_uninformative_groups() -> None:
    rounds = [[_delivery(t, FLAT) for t in round_tickets(0, r, 2)] for r in range(3)]
    rounds[2][1] = _delivery(round_tickets(0, 2, 2)[1], MIXED)
    chosen = select_groups(rounds, 2)
    # the informative one, and the first uninformative read (prompt 0), in read order
    assert _ids(chosen.trained) == [0, round_tickets(0, 2, 2)[1]]
    assert (chosen.filtered, chosen.surplus, chosen.filled) == (4, 0, 1)
    nothing = select_groups([[_delivery(0, FLAT), _delivery(1, FLAT)]], 2)
    assert _ids(nothing.trained) == [0, 1] and nothing.filled == 2 and nothing.filtered == 0


def test_take_dynamic_asks_for_rounds_only_while_short_and_within_the_cap() -> None:
    rewards = {0: [FLAT, FLAT], 1: [FLAT, MIXED], 2: [MIXED, MIXED], 3: [MIXED, MIXED]}
    asked: list[int] = []

    def take_round(r: int) -> list[Delivery]:
        return [_delivery(t, rw) for t, rw in zip(round_tickets(0, r, 2), rewards[r], strict=True)]

    chosen = take_dynamic(take_round, asked.append, n_groups=2, max_extra_rounds=5)
    assert asked == [1, 2]  # 0 informative, then 1, then 3 >= 2: stop
    assert _ids(chosen.trained) == [round_tickets(0, 1, 2)[1], round_tickets(0, 2, 2)[0]]
    asked.clear()
    capped = take_dynamic(take_round, asked.append, n_groups=2, max_extra_rounds=1)
    assert asked == [1] and capped.filled == 1 and capped.extra_rounds == 1


# ---- the learner on a real Redis ---------------------------------------------------------------

# batch -> round -> each prompt's rewards. Batch 0: one flat group, round 1 brings two
# informative ones (one surplus). Batch 1: flat until round 2 brings one: the cap (2 rounds) is
# reached, so the earliest flat group (prompt 2) completes the batch.
PLAN = {
    0: {0: [FLAT, MIXED], 1: [MIXED, MIXED]},
    1: {0: [FLAT, FLAT], 1: [FLAT, FLAT], 2: [FLAT, MIXED]},
}


def _push_plan(producer: RolloutProducer) -> None:
    """Every draw the plan has, pushed up front: a requested round's groups are then waiting
    under their draw key (the generator's side is tested in tests/buffer/test_ticket_rounds)."""
    for batch, rounds in PLAN.items():
        for r, rewards in rounds.items():
            for ticket, rw in zip(round_tickets(batch, r, P), rewards, strict=True):
                producer.push(_delivery(ticket, rw, batch).group, batch_index=draw_key(batch, r))


def _task(tmp_path: Path, name: str, checkpoint_every: int) -> LearnerTask:
    return fixed_task(
        make_arm(name="dapo", objective="grpo", agg="token-mean", dynamic_sampling_rounds=2),
        LearnerConfig(steps=2, prompts_per_step=P, checkpoint_every=checkpoint_every),
        seed=SEED,
        group_size=G,
        model_dir=save_tiny_policy(tmp_path / "model"),
        trial_dir=tmp_path / name,
        take_timeout_s=20,
    )


class KilledError(Exception):
    """Stands in for a kill -9 of the learner between two checkpoints."""


def _run(task: LearnerTask, client, *, resume: bool = False, on_step=None):
    weights_dir = task.trial_dir / "weights"
    return run_on_redis(task, client, RUN, weights_dir=weights_dir, resume=resume, on_step=on_step)


def _metrics(trial_dir: Path) -> list[dict[str, float | None]]:
    """Every row's metrics but wall-clock ones, NaN as None (so rows compare with ==)."""
    rows = pq.read_table(trial_dir / "metrics.parquet").to_pylist()
    return [
        {k: None if _is_nan(v) else v for k, v in row.items() if _reproducible(k)} for row in rows
    ]


def _trained(trial_dir: Path) -> list[tuple[int, str]]:
    return [(row["step"], row["group_id"]) for row in GroupLedger(trial_dir).read()]


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _reproducible(name: str) -> bool:
    return name != M.TIMESTAMP and not M.is_timing_dependent(name)


def test_the_learner_filters_asks_for_rounds_and_commits_every_group_it_read(
    redis_server, tmp_path: Path
) -> None:
    client = redis_server.client()
    _push_plan(RolloutProducer(client, RUN))
    task = _task(tmp_path, "trial", checkpoint_every=1)
    outcome = _run(task, client)
    assert outcome.status == TrialStatus.COMPLETED and outcome.steps_completed == 2
    trained = [(row["step"], row["prompt_index"]) for row in GroupLedger(task.trial_dir).read()]
    r = {(b, k): round_tickets(b, k, P) for b in PLAN for k in PLAN[b]}
    assert trained == [(1, 1), (1, r[0, 1][0]), (2, 2), (2, r[1, 2][1])]
    rows = _metrics(task.trial_dir)
    step1, step2 = rows[1], rows[2]
    assert (step1[M.SAMPLING_EXTRA_ROUNDS], step2[M.SAMPLING_EXTRA_ROUNDS]) == (1.0, 2.0)
    assert step1[M.SAMPLING_GROUPS_FILTERED] == 1 and step1[M.SAMPLING_GROUPS_SURPLUS] == 1
    assert step2[M.SAMPLING_GROUPS_FILTERED] == 4 and step2[M.SAMPLING_GROUPS_FILLED] == 1
    assert step1[M.GROUPS_TRAINED] == step2[M.GROUPS_TRAINED] == P
    # tokens/generated charges every group read, filtered and surplus included
    read = {1: [(0, 0), (0, 1)], 2: [(1, 0), (1, 1), (1, 2)]}
    for step, draws in read.items():
        tokens = 0
        for batch, k in draws:
            for ticket, rw in zip(r[batch, k], PLAN[batch][k], strict=True):
                group = _delivery(ticket, rw, batch).group
                tokens += sum(len(ids) for ids in group.response_ids)
        assert rows[step][M.TOKENS_GENERATED] == tokens
    # every group read is committed (nothing left pending to be read again), and the learner
    # asked for exactly the rounds it read
    assert client.xlen(RunKeys(RUN).stream) == 0
    assert client.scard(RunKeys(RUN).trained) == 4 + 6
    issued_or_requested = TicketDispenser(client, RUN).requested_extra()
    assert sorted(issued_or_requested) == sorted(r[0, 1] + r[1, 1] + r[1, 2])


def test_a_killed_learner_redoes_the_same_rounds_and_trains_each_group_once(
    redis_server, tmp_path: Path
) -> None:
    client = redis_server.client()
    _push_plan(RolloutProducer(client, RUN))
    whole = _run(_task(tmp_path, "whole", checkpoint_every=2), client)
    assert whole.status == TrialStatus.COMPLETED
    expected = _metrics(tmp_path / "whole")
    ledger = _trained(tmp_path / "whole")

    client.flushdb()
    _push_plan(RolloutProducer(client, RUN))
    task = _task(tmp_path, "killed", checkpoint_every=2)

    def kill_after_step_1(step: int, _metrics: dict[str, float]) -> None:
        if step == 1:
            raise KilledError

    with pytest.raises(KilledError):  # step 1 read two rounds of batch 0; nothing committed
        _run(task, client, on_step=kill_after_step_1)
    assert client.scard(RunKeys(RUN).trained) == 0
    resumed = _run(task, client, resume=True)
    assert resumed.status == TrialStatus.COMPLETED and resumed.steps_completed == 2
    assert _metrics(task.trial_dir) == expected  # bitwise, steps and sampling metrics alike
    assert _trained(task.trial_dir) == ledger
    assert client.xlen(RunKeys(RUN).stream) == 0
    assert client.scard(RunKeys(RUN).trained) == 10
