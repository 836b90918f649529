"""The rollout log of an in-process learner on a real redis-server, at a non-default option:
`learner.rollout_log` every 2 steps (plus the first and the last) and half of the groups chosen
by group id, text from the decoder port the harness fills with its tokenizer. The default
option (every step, every group), truncation on resume and a damaged part are pinned on the
shared trial of tests/learner/test_resume_damage.py."""

from __future__ import annotations

from pathlib import Path

from buffer.producer import RolloutProducer
from contract.rollout_log import is_logged_group
from contract.trial import TrialStatus
from learner.config import LearnerConfig, RolloutLogConfig, make_arm
from learner.runtime.metrics_log import GroupLedger
from learner.runtime.records import RolloutLog
from learner.runtime.task import TextDecoder
from tests.learner.learner_runs import fixed_task, push_lag0_batches, run_on_redis
from tests.learner.tiny import save_tiny_policy

RUN, SEED, PER_STEP, GROUP_SIZE, STEPS = "rollout-log", 7, 4, 2, 4
SHARE = 0.5


def _letters(ids: object) -> str:
    """A stand-in tokenizer: token id i is the letter chr(ord('a') + i)."""
    return "".join(chr(ord("a") + int(i)) for i in ids)


def test_every_and_share_pick_the_steps_and_groups_and_the_text_is_decoded(
    redis_server, tmp_path: Path
) -> None:
    client = redis_server.client()
    producer = RolloutProducer(client, RUN)
    push_lag0_batches(producer, RUN, SEED, range(STEPS), per_step=PER_STEP, group_size=GROUP_SIZE)
    option = RolloutLogConfig(every=2, share=SHARE)
    task = fixed_task(
        make_arm(name="grpo", objective="grpo"),
        LearnerConfig(
            steps=STEPS, prompts_per_step=PER_STEP, checkpoint_every=2, rollout_log=option
        ),
        seed=SEED,
        group_size=GROUP_SIZE,
        model_dir=save_tiny_policy(tmp_path / "model"),
        trial_dir=tmp_path / "trial",
        take_timeout_s=20,
    )
    task.decode = TextDecoder(prompt=_letters, response=lambda ids: _letters(ids).upper())
    outcome = run_on_redis(task, client, RUN, weights_dir=tmp_path / "weights")
    assert outcome.status == TrialStatus.COMPLETED and outcome.steps_completed == STEPS

    log = RolloutLog(task.trial_dir)
    trained = [(r["step"], r["group_id"]) for r in GroupLedger(task.trial_dir).read()]
    shared = [(s, g) for s, g in trained if is_logged_group(g, SHARE)]
    # the first step, every 2nd after it and the last; of those, the groups the share picks
    expected = [(s, g) for s, g in shared if s in (1, 3, 4)]
    assert 0 < len(expected) < len([t for t in trained if t[0] in (1, 3, 4)])
    assert any(s == 2 for s, _ in shared)  # step 2 had groups to log: `every` left them out
    assert log.steps() == sorted({s for s, _ in expected})  # a step with none has no part
    rows = log.read().to_pylist()
    assert list(dict.fromkeys((r["step"], r["group_id"]) for r in rows)) == expected
    assert len(rows) == len(expected) * GROUP_SIZE
    for row in rows:
        assert row["prompt_text"] == _letters(row["prompt_ids"])
        assert row["response_text"] == _letters(row["response_ids"]).upper()
        assert row["token_versions"] == [row["step"] - 1] * len(row["response_ids"])
