"""Per-token versions at the learner (rollout schema v3, partial rollouts): intake refuses a
group with a token newer than the learner (bounded) or spanning versions in fixed mode, each in
one line to the dead letter; the step's metrics report per-token lag next to per-group lag (a
real redis-server, the tiny policy, in process)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from buffer.connection import RunKeys
from buffer.producer import RolloutProducer
from contract import metrics as M
from contract.trial import TrialStatus
from learner.runtime.metrics_log import MetricsLog
from learner.runtime.step_metrics import token_lag_metrics
from tests.learner.learner_runs import grpo_task, pushed_group, run_on_redis

RUN, SEED, PER_STEP, GROUP_SIZE = "versions-run", 5, 2, 4


def _group(batch: int, prompt: int, version: int, token_versions=None, suffix: str = ""):
    group = pushed_group(
        RUN, SEED, batch=batch, prompt=prompt, version=version, group_size=GROUP_SIZE, draw=prompt
    )
    group = dataclasses.replace(group, group_id=group.group_id + suffix)
    if token_versions is None:
        return group
    versions = [token_versions(len(r)) for r in group.response_ids]
    return dataclasses.replace(group, token_versions=versions)


def _rising(start: int):
    """Versions start, start + 1, ... along a response (a response continued twice)."""
    return lambda n: [start + min(t, 2) for t in range(n)]


def test_token_lag_metrics_by_hand() -> None:
    # Step 3; one group started at v1: a 3-token response of versions 1, 2, 3 (lags 2, 1, 0) and
    # a 1-token one at 1 (lag 2); another whole at v3 (lag 0, 2 tokens).
    spanning = dataclasses.replace(
        _group(0, 0, 1), response_ids=[[5, 6, 7], [8]], behavior_logprobs=[[-1.0] * 3, [-1.0]],
        rewards=[0.0, 1.0], reward_infos=["{}"] * 2, finish_reasons=["stop"] * 2,
        token_versions=[[1, 2, 3], [1]],
    )  # fmt: skip
    whole = dataclasses.replace(
        _group(0, 1, 3), response_ids=[[5, 6]], behavior_logprobs=[[-1.0, -1.0]], rewards=[1.0],
        reward_infos=["{}"], finish_reasons=["stop"],
    )  # fmt: skip
    got = token_lag_metrics([spanning, whole], step=3)
    assert got[M.STALENESS_TOKEN_LAG_MEAN] == pytest.approx((2 + 1 + 0 + 2 + 0 + 0) / 6)
    assert got[M.STALENESS_TOKEN_LAG_MAX] == 2
    assert got[M.STALENESS_TOKENS_LAG0_FRAC] == pytest.approx(3 / 6)
    assert got[M.STALENESS_TOKENS_LAG1_FRAC] == pytest.approx(1 / 6)
    assert got[M.STALENESS_TOKENS_LAG2_FRAC] == pytest.approx(2 / 6)
    assert got[M.STALENESS_TOKENS_LAG3PLUS_FRAC] == 0
    assert got[M.STALENESS_SPANNING_FRAC] == pytest.approx(1 / 3)  # 1 of 3 responses


def _task(tmp_path: Path, mode: str, lag: int, steps: int):
    return grpo_task(
        tmp_path, seed=SEED, per_step=PER_STEP, group_size=GROUP_SIZE, steps=steps,
        mode=mode, lag=lag,
    )  # fmt: skip


def _reasons(client) -> list[str]:
    return [f[b"reason"].decode() for _, f in client.xrange(RunKeys(RUN).dead_letter)]


def test_bounded_mode_trains_spanning_groups_and_refuses_tokens_from_the_future(
    redis_server, tmp_path: Path
) -> None:
    client = redis_server.client()
    producer = RolloutProducer(client, RUN)
    for prompt in (0, 1):
        producer.push(_group(0, prompt, 0), batch_index=0)
    # Step 2 (learner version 1): groups started at v0 and continued into v1 are trained; one
    # with a token of v2 (under an id of its own) was sampled by weights no one has yet.
    producer.push(_group(1, 2, 0, _rising(0), suffix="-x"), batch_index=1)
    for prompt in (2, 3):
        producer.push(_group(1, prompt, 0, lambda n: [0] + [1] * (n - 1)), batch_index=1)
    task = _task(tmp_path, "bounded", lag=1, steps=2)
    outcome = run_on_redis(task, client, RUN, weights_dir=tmp_path / "weights")
    assert outcome.status == TrialStatus.COMPLETED
    reasons = _reasons(client)
    assert any("a token of version 2 is newer than the learner's version 1" in r for r in reasons)
    rows = MetricsLog(task.trial_dir).read().to_pandas().set_index("step")
    assert rows.loc[2, M.STALENESS_MEAN] == 1.0  # the groups started at v0 ...
    assert rows.loc[2, M.STALENESS_TOKEN_LAG_MEAN] < 1.0  # ... their later tokens are fresher
    assert rows.loc[1, M.STALENESS_SPANNING_FRAC] == 0.0


def test_fixed_mode_refuses_groups_whose_tokens_span_versions(redis_server, tmp_path: Path) -> None:
    client = redis_server.client()
    producer = RolloutProducer(client, RUN)
    spanning = _group(0, 0, 0, lambda n: [0] * (n - 1) + [1])
    producer.push(dataclasses.replace(spanning, group_id=spanning.group_id + "-x"), batch_index=0)
    for prompt in (0, 1):
        producer.push(_group(0, prompt, 0), batch_index=0)
    outcome = run_on_redis(
        _task(tmp_path, "fixed", lag=0, steps=1), client, RUN, weights_dir=tmp_path / "weights"
    )
    assert outcome.status == TrialStatus.COMPLETED
    (reason,) = _reasons(client)
    assert "tokens of versions 0..1, but fixed mode generates every token of batch 0 with " \
        "version 0" in reason  # fmt: skip
