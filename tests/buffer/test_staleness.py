"""`buffer.staleness`: each rule's versions, admission, intake check, options and words, off
the defaults (lag 2, weights synced every 3 steps)."""

from __future__ import annotations

import numpy as np
import pytest

from buffer.staleness import BoundedLag, FixedLag, group_lag, staleness_policy
from tests.buffer.factories import make_group


def test_the_rule_is_chosen_once_from_the_mode() -> None:
    assert isinstance(staleness_policy("fixed", 2, 3), FixedLag)
    assert isinstance(staleness_policy("bounded", 2, 3), BoundedLag)
    with pytest.raises(ValueError, match="lag=-1"):
        staleness_policy("fixed", -1)


def test_fixed_lag_makes_batch_k_with_the_synced_version_of_k_minus_lag() -> None:
    rule = FixedLag(lag=2, sync_every=3)
    # batch 9 -> version 7 -> synced down to 6, whatever is published
    assert [rule.ticket_version(9, published) for published in (6, 8, 20)] == [6, 6, 6]
    assert [rule.ticket_version(k, 50) for k in range(5)] == [0, 0, 0, 0, 0]
    assert rule.admission_limit(published=4, prompts_per_step=8) == (4 + 2 + 1) * 8
    assert rule.max_lag == 4 and rule.replays_exactly and rule.extra_rounds
    assert rule.version_problem(make_group(0, 9, policy_version=6), 9, learner_version=9) is None
    assert rule.version_problem(make_group(0, 9, policy_version=7), 9, 9) == (
        "policy_version 7, but fixed mode at lag 2 syncing every 3 steps generates batch 9 "
        "with version 6"
    )


def test_bounded_lag_takes_the_newest_synced_version_and_refuses_only_future_ones() -> None:
    rule = BoundedLag(lag=2, sync_every=3)
    assert [rule.ticket_version(9, published) for published in (6, 8, 9)] == [6, 6, 9]
    assert rule.max_lag == 4 and not rule.replays_exactly and rule.partial_rollouts
    assert rule.version_problem(make_group(0, 9, policy_version=1), 9, learner_version=9) is None
    assert "newer than the learner's version 5" in rule.version_problem(
        make_group(0, 9, policy_version=6), 9, learner_version=5
    )


def test_each_rule_names_the_options_it_refuses() -> None:
    assert FixedLag.refusal("partial_rollouts", "x") == (
        "x needs staleness.mode: bounded: fixed mode generates each batch with exactly one "
        "version (and so repeats bit for bit), while a partial rollout takes new weights "
        "whenever they are published"
    )
    assert FixedLag.refusal("dynamic_sampling_rounds", "arms ['a']") is None
    assert BoundedLag.refusal("partial_rollouts", "x") is None
    assert "arms ['a'] set dynamic_sampling_rounds" in BoundedLag.refusal(
        "dynamic_sampling_rounds", "arms ['a']"
    )


def test_words_and_lag() -> None:
    assert BoundedLag(2, 3).words(partial_rollouts=True) == (
        "bounded, max lag 2, partial rollouts, weights synced every 3 steps"
    )
    assert FixedLag(1).words() == "fixed lag 1"
    assert group_lag(7, 4) == 3
    assert group_lag(7, np.array([7, 5, 0])).tolist() == [0, 2, 7]
