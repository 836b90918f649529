"""What the learner refuses to train (learner.runtime.intake), on a real redis-server: groups that
break the fixed-lag rule never displace the real ones, poison groups go to the dead letter."""

from __future__ import annotations

import dataclasses

import redis

from buffer.connection import RunKeys
from buffer.rollout_buffer import RolloutBuffer
from buffer.schema import make_group_id
from buffer.streams import Delivery
from learner.runtime.intake import (
    ModelLimits,
    fixed_rule,
    fixed_rule_violation,
    poison_reason,
    split_poison,
)
from tests.buffer.factories import RUN_ID, make_group
from tests.buffer.run_state import dead_letter_count

KEYS = RunKeys(RUN_ID)
PER_STEP, LAG, SEED = 2, 1, 0


def _dead_letter_reasons(client: redis.Redis) -> list[str]:
    return [fields[b"reason"].decode() for _, fields in client.xrange(KEYS.dead_letter)]


def test_fixed_rule_names_what_is_wrong() -> None:
    # Batch 3 at lag 1: version 2, prompts 6 and 7, ids s0-b3-p6 / s0-b3-p7.
    real = make_group(6, batch_index=3, policy_version=2)
    assert (
        fixed_rule_violation(Delivery("1-0", real, 3, 2), lag=1, prompts_per_step=2, seed=0) is None
    )
    future = make_group(6, batch_index=3, policy_version=999)
    reason = fixed_rule_violation(
        Delivery("1-0", future, 3, 999), lag=1, prompts_per_step=2, seed=0
    )
    assert reason is not None and "policy_version 999" in reason and "version 2" in reason
    outside = make_group(9, batch_index=3, policy_version=2)
    reason = fixed_rule_violation(Delivery("1-0", outside, 3, 2), lag=1, prompts_per_step=2, seed=0)
    assert reason is not None and "outside batch 3's [6, 8)" in reason
    renamed = dataclasses.replace(real, group_id="s0-b3-p7")
    reason = fixed_rule_violation(Delivery("1-0", renamed, 3, 2), lag=1, prompts_per_step=2, seed=0)
    assert reason is not None and "should be 's0-b3-p6'" in reason


def test_poison_is_outside_the_vocabulary_or_the_context() -> None:
    group = make_group(1, lengths=(3, 2))  # token ids up to 1000 + 100 + 1 = 1101; 2 + 3 tokens
    assert poison_reason(group, ModelLimits(vocab_size=2000, max_positions=5)) is None
    reason = poison_reason(group, ModelLimits(vocab_size=1101))
    assert reason is not None and "token id 1101" in reason and "vocabulary of 1101" in reason
    reason = poison_reason(group, ModelLimits(vocab_size=2000, max_positions=4))
    assert reason is not None and "5 tokens exceed the model's context of 4" in reason
    good, poison = split_poison(
        [Delivery("1-0", group, 0, 0), Delivery("2-0", make_group(0), 0, 0)],
        ModelLimits(vocab_size=1100),
    )
    assert [d.entry_id for d in good] == ["2-0"] and [d.entry_id for d in poison[0][:1]] == ["1-0"]


def test_a_forged_group_never_displaces_the_real_one(
    buffer: RolloutBuffer, client: redis.Redis
) -> None:
    """A group claiming batch 1 with a future version arrives first and is dead-lettered; the
    real groups of batch 1 are the ones returned. (Under a real group's id it would be refused
    at push as a conflicting duplicate instead, buffer.outbox.)"""
    forged = dataclasses.replace(
        make_group(2, batch_index=1, policy_version=999), group_id="s0-b1-p2-forged"
    )
    buffer.push(forged, batch_index=1)
    for prompt in (2, 3):
        buffer.push(make_group(prompt, batch_index=1, policy_version=0), batch_index=1)
    rule = fixed_rule(LAG, PER_STEP, SEED)
    got = buffer.take_batch(1, PER_STEP, consumer="learner", timeout_s=2, accept=rule)
    assert [d.group.group_id for d in got] == [make_group_id(0, 1, 2), make_group_id(0, 1, 3)]
    assert all(d.group.policy_version == 0 for d in got)
    assert dead_letter_count(client) == 1
    [reason] = _dead_letter_reasons(client)
    assert "policy_version 999" in reason


def test_rejected_groups_go_to_the_dead_letter_with_their_payload(
    buffer: RolloutBuffer, client: redis.Redis
) -> None:
    for prompt in (0, 1):
        buffer.push(make_group(prompt), batch_index=0)
    taken = buffer.take_batch(0, 2, consumer="learner", timeout_s=2)
    buffer.reject(taken[:1], "token id 5000 is outside the model's vocabulary", "learner")
    assert dead_letter_count(client) == 1
    [(_, fields)] = client.xrange(KEYS.dead_letter)
    assert b"vocabulary" in fields[b"reason"] and fields[b"payload_bytes"] != b"0"
    assert buffer.depth() == 1  # the rejected entry is acked and deleted, the other pending
    buffer.commit(taken[1:])
    assert buffer.depth() == 0
