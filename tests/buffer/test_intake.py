"""What the learner refuses to train (buffer.intake), on a real redis-server: every group
is checked before it can take a batch slot or count as seen, so a refused copy never displaces
the real group, and a slot whose admitted copy is refused ends the take at once."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import redis

from buffer.connection import RunKeys
from buffer.consumer import RolloutConsumer, SlotRefusedError
from buffer.intake import (
    IntakeRules,
    ModelLimits,
    TrialSlots,
    model_problem,
    refusal,
)
from buffer.producer import RolloutProducer
from buffer.rollout_group import RolloutGroup
from buffer.schema import make_group_id
from buffer.streams import Delivery
from buffer.telemetry import DUPLICATE
from learner.config import LearnerConfig
from tests.buffer.factories import RUN_ID, make_group
from tests.buffer.run_state import counter, dead_letter_count, xadd_unchecked

KEYS = RunKeys(RUN_ID)
PER_STEP, LAG, SEED = 2, 1, 0
SLOTS = TrialSlots(SEED, PER_STEP, steps=4)


def _rules(**changes: object) -> IntakeRules:
    """make_group's groups: 2 samples of at most 3 tokens, token ids up to ~4000."""
    values: dict[str, object] = {
        "mode": "fixed", "lag": LAG, "seed": SEED, "prompts_per_step": PER_STEP,
        "group_size": 2, "max_new_tokens": 8, "reward_range": (-1e4, 1e4),
        "limits": ModelLimits(vocab_size=100_000),
    }  # fmt: skip
    values.update(changes)
    return IntakeRules(**values)  # type: ignore[arg-type]


def _dead_letter_reasons(client: redis.Redis) -> list[str]:
    return [fields[b"reason"].decode() for _, fields in client.xrange(KEYS.dead_letter)]


def _why(group: RolloutGroup, batch: int, rules: IntakeRules | None = None) -> str | None:
    return refusal(Delivery("1-0", group, batch, group.policy_version), rules or _rules(), 0)


def test_the_staleness_rule_names_what_is_wrong() -> None:
    # Batch 3 at lag 1: version 2, prompts 6 and 7, ids s0-b3-p6 / s0-b3-p7.
    real = make_group(6, batch_index=3, policy_version=2)
    assert _why(real, 3) is None
    reason = _why(make_group(6, batch_index=3, policy_version=999), 3)
    assert reason == (
        "group 's0-b3-p6' (batch 3): policy_version 999, but fixed mode at lag 1 generates "
        "batch 3 with version 2"
    )
    reason = _why(make_group(9, batch_index=3, policy_version=2), 3)
    assert reason is not None and "prompt_index 9 is outside batch 3's [6, 8)" in reason
    reason = _why(dataclasses.replace(real, group_id="s0-b3-p7"), 3)
    assert reason is not None and "id should be 's0-b3-p6' for seed 0, batch 3" in reason
    # Bounded mode: any version up to the learner's own; a newer one no generator can have.
    bounded = _rules(mode="bounded")
    older = make_group(6, batch_index=3, policy_version=1)
    assert refusal(Delivery("1-0", older, 3, 1), bounded, learner_version=2) is None
    reason = refusal(Delivery("1-0", real, 3, 2), bounded, learner_version=1)
    assert reason is not None and "policy_version 2 is newer than the learner's version 1" in reason


def test_poison_is_outside_the_vocabulary_or_the_context() -> None:
    group = make_group(1, lengths=(3, 2))  # token ids up to 1000 + 100 + 1 = 1101; 2 + 3 tokens
    assert model_problem(group, ModelLimits(vocab_size=2000, max_positions=5)) is None
    reason = model_problem(group, ModelLimits(vocab_size=1101))
    assert reason is not None and "token id 1101" in reason and "vocabulary of 1101" in reason
    reason = model_problem(group, ModelLimits(vocab_size=2000, max_positions=4))
    assert reason is not None and "5 tokens exceed the model's context of 4" in reason


def _samples(group: RolloutGroup, keep: int) -> RolloutGroup:
    return dataclasses.replace(
        group,
        response_ids=group.response_ids[:keep],
        behavior_logprobs=group.behavior_logprobs[:keep],
        rewards=group.rewards[:keep],
        reward_infos=group.reward_infos[:keep],
        finish_reasons=group.finish_reasons[:keep],
    )


def _long(group: RolloutGroup) -> RolloutGroup:
    return dataclasses.replace(
        group,
        response_ids=[np.full(30, 7, dtype=np.int32), *group.response_ids[1:]],
        behavior_logprobs=[np.full(30, -0.5, dtype=np.float32), *group.behavior_logprobs[1:]],
    )


def _token(group: RolloutGroup, token: int) -> RolloutGroup:
    response = group.response_ids[0].copy()
    response[0] = token
    return dataclasses.replace(group, response_ids=[response, *group.response_ids[1:]])


PROMPTS = {2: [2001, 2002], 3: [3001, 3002]}  # make_group's prompt of each index

FORGERIES = [
    pytest.param(lambda g: _samples(g, 1), "1 samples, but generation.group_size is 2", id="short"),
    pytest.param(
        lambda g: dataclasses.replace(g, rewards=[1e30, 0.0]),
        "reward 1e+30 is outside learner.reward_range [-10000.0, 10000.0]",
        id="reward-1e30",
    ),
    pytest.param(
        lambda g: dataclasses.replace(g, rewards=[0.0, -3.3e38]),
        "reward -3.3e+38 is outside learner.reward_range",
        id="reward-3e38",
    ),
    pytest.param(
        _long, "a response of 30 tokens, over generation.max_new_tokens=8", id="over-long"
    ),
    pytest.param(
        lambda g: _token(g, 200_000),
        "token id 200000 is outside the model's vocabulary of 100000",
        id="out-of-vocabulary",
    ),
    pytest.param(
        lambda g: dataclasses.replace(g, policy_version=1),
        "policy_version 1, but fixed mode at lag 1 generates batch 1 with version 0",
        id="version",
    ),
    pytest.param(
        lambda g: dataclasses.replace(g, prompt_ids=[3001, 3002]),
        "its prompt (2 tokens) is not prompt 2 of the trial's prompt stream (2 tokens)",
        id="prompt",
    ),
]


@pytest.mark.parametrize(("forge", "why"), FORGERIES)
def test_a_refused_copy_read_first_never_displaces_the_real_group(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis, forge, why: str
) -> None:
    """A copy of s0-b1-p2 under the real id, added ahead of it without the outbox's claim (so
    the id stays free): refused with its reason, and the real group, read after it, fills the
    slot; it is no duplicate of a copy that was never accepted."""
    real = {p: make_group(p, batch_index=1) for p in (2, 3)}
    xadd_unchecked(client, forge(real[2]), batch_index=1)
    for group in real.values():
        producer.push(group, batch_index=1)
    rules = _rules(prompt_ids=PROMPTS.__getitem__)
    got = consumer.take_batch(1, PER_STEP, "learner", timeout_s=5, rules=rules, slots=SLOTS)
    assert [d.group for d in got] == [real[2], real[3]]
    [reason] = _dead_letter_reasons(client)
    assert reason.startswith("group 's0-b1-p2' (batch 1): ") and why in reason
    assert "\n" not in reason
    assert counter(client, DUPLICATE) == 0 and dead_letter_count(client) == 1


def test_a_group_with_another_id_never_displaces_the_real_one(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    """A group claiming batch 1 with a future version, under an id of its own, arrives first and
    is dead-lettered; the real groups of batch 1 are the ones returned."""
    forged = dataclasses.replace(
        make_group(2, batch_index=1, policy_version=999), group_id="s0-b1-p2-forged"
    )
    producer.push(forged, batch_index=1)
    for prompt in (2, 3):
        producer.push(make_group(prompt, batch_index=1, policy_version=0), batch_index=1)
    got = consumer.take_batch(1, PER_STEP, "learner", timeout_s=2, rules=_rules(), slots=SLOTS)
    assert [d.group.group_id for d in got] == [make_group_id(0, 1, 2), make_group_id(0, 1, 3)]
    assert all(d.group.policy_version == 0 for d in got)
    assert dead_letter_count(client) == 1
    [reason] = _dead_letter_reasons(client)
    assert "policy_version 999" in reason


def test_a_refused_admitted_copy_ends_the_take_of_its_batch_at_once(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    """s0-b1-p3 was pushed through the buffer as a 1-sample group (as a generator that made it
    would, or a forger who pushed first): the buffer admits no other copy of that id, so batch 1
    can never be complete. Batch 0 is still taken; the take of batch 1 raises at once, and again
    when retried, instead of waiting out its timeout."""
    for prompt in (0, 1):
        producer.push(make_group(prompt, batch_index=0), batch_index=0)
    producer.push(make_group(2, batch_index=1), batch_index=1)
    producer.push(_samples(make_group(3, batch_index=1), 1), batch_index=1)
    assert producer.push(make_group(3, batch_index=1), batch_index=1) == ""  # a conflict now
    got = consumer.take_batch(0, PER_STEP, "learner", timeout_s=5, rules=_rules(), slots=SLOTS)
    assert [d.group.group_id for d in got] == ["s0-b0-p0", "s0-b0-p1"]
    started = time.monotonic()
    for _ in range(2):
        with pytest.raises(SlotRefusedError) as refused:
            consumer.take_batch(1, PER_STEP, "learner", timeout_s=60, rules=_rules(), slots=SLOTS)
        assert refused.value.group_id == "s0-b1-p3"
        message = str(refused.value)
        assert message.startswith("group 's0-b1-p3' (batch 1): 1 samples, but generation.")
        assert "its batch can never be complete" in message and "\n" not in message
    assert time.monotonic() - started < 30
    # An id no slot of the trial needs (another seed, a batch past the last step) ends nothing.
    assert "s0-b1-p3" in SLOTS
    assert "s1-b1-p3" not in SLOTS and "s0-b4-p8" not in SLOTS and "s0-b1-p1" not in SLOTS
    assert "s0-b01-p3" not in SLOTS and "s0-b1-p3-x" not in SLOTS


def test_a_well_formed_forgery_read_first_fills_the_slot(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    """What the checks cannot do: a copy with the real id, version and prompt and plausible
    values is indistinguishable from the real group. The first one read fills the slot; the
    real group, read after it, is a duplicate. (Only write access to Redis can forge this.)"""
    real = make_group(2, batch_index=1)
    forged = dataclasses.replace(real, rewards=[1.0, 1.0])
    xadd_unchecked(client, forged, batch_index=1)
    producer.push(real, batch_index=1)
    producer.push(make_group(3, batch_index=1), batch_index=1)
    got = consumer.take_batch(1, PER_STEP, "learner", timeout_s=5, rules=_rules(), slots=SLOTS)
    assert got[0].group == forged
    assert counter(client, DUPLICATE) == 1 and dead_letter_count(client) == 0


def test_bounded_take_refuses_a_group_newer_than_the_learner(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    producer.push(make_group(0, batch_index=0, policy_version=3), batch_index=0)
    producer.push(make_group(1, batch_index=0, policy_version=0), batch_index=0)
    taken = consumer.take(1, 0, 1, "learner", timeout_s=5, rules=_rules(mode="bounded"))
    assert [d.group.group_id for d in taken.deliveries] == ["s0-b0-p1"]
    [reason] = _dead_letter_reasons(client)
    assert "policy_version 3 is newer than the learner's version 0" in reason


@pytest.mark.parametrize("bad", [(1.0, 0.0), (0.0, 0.0), (float("-inf"), 1.0), (0.0, float("nan"))])
def test_reward_range_must_be_finite_and_increasing(bad: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match=r"learner\.reward_range=.* low < high"):
        LearnerConfig(reward_range=bad)
    assert LearnerConfig().reward_range == (-1e4, 1e4)


def test_rejected_groups_go_to_the_dead_letter_with_their_payload(
    producer: RolloutProducer, consumer: RolloutConsumer, client: redis.Redis
) -> None:
    for prompt in (0, 1):
        producer.push(make_group(prompt), batch_index=0)
    taken = consumer.take_batch(0, 2, consumer="learner", timeout_s=2)
    consumer.reject(taken[:1], "token id 5000 is outside the model's vocabulary", "learner")
    assert dead_letter_count(client) == 1
    [(_, fields)] = client.xrange(KEYS.dead_letter)
    assert b"vocabulary" in fields[b"reason"] and fields[b"payload_bytes"] != b"0"
    assert consumer.depth() == 1  # the rejected entry is acked and deleted, the other pending
    consumer.commit(taken[1:])
    assert consumer.depth() == 0
