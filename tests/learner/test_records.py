"""The learner's step records (learner.runtime.records.StepRecords: metric rows, eval rows,
ledger, rollout log) and a step's perf/* timings (learner.runtime.step_metrics.perf_metrics)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from contract import metrics as M
from contract.evals import EvalReport, EvalSetScore
from contract.rollout_log import is_logged_group
from learner.config import RolloutLogConfig
from learner.runtime.records import StepRecords, rollouts_to_log
from learner.runtime.step_metrics import perf_metrics
from learner.runtime.task import TextDecoder
from tests.learner.tiny import random_groups


def _write_steps(records: StepRecords, steps: range) -> None:
    for step in steps:
        ledger = [{"group_id": f"s0-b{step - 1}-p0"}] if step else None  # step 0 trains nothing
        records.append(step, 1000.0 + step, {M.REWARD_MEAN: step / 4}, ledger)
        records.eval_pass_rate(step, EvalReport((EvalSetScore("main", 8, step / 8),)))


def test_append_truncate_and_what_a_checkpoint_vouches_for(tmp_path: Path) -> None:
    records = StepRecords(tmp_path)
    _write_steps(records, range(4))
    assert records.metrics.steps() == [0, 1, 2, 3]
    assert records.ledger.steps() == [1, 2, 3]
    assert records.evals.steps() == [0, 1, 2, 3]
    vouched = records.vouched(2)
    # steps 0..2: 3 metric parts, 3 eval parts, 2 ledger files, named relative to the trial
    assert sorted(vouched) == [
        "evals.parquet/part-000000.parquet", "evals.parquet/part-000001.parquet",
        "evals.parquet/part-000002.parquet", "metrics.parquet/part-000000.parquet",
        "metrics.parquet/part-000001.parquet", "metrics.parquet/part-000002.parquet",
        "trained_groups/step-000001.json", "trained_groups/step-000002.json",
    ]  # fmt: skip
    assert all(tmp_path / name == path for name, (_, path) in vouched.items())
    assert vouched["trained_groups/step-000002.json"][0] == 2
    records.truncate_after(1)
    assert (records.metrics.steps(), records.evals.steps(), records.ledger.steps()) == (
        [0, 1],
        [0, 1],
        [1],
    )
    assert [row["group_id"] for row in records.ledger.read()] == ["s0-b0-p0"]


def test_eval_pass_rate_writes_rows_only_for_a_report(tmp_path: Path) -> None:
    records = StepRecords(tmp_path)
    assert records.eval_pass_rate(0, 0.25) == 0.25  # a bare rate: no eval rows
    assert records.evals.steps() == []
    report = EvalReport((EvalSetScore("main", 8, 0.5), EvalSetScore("hard", 4, 0.0)))
    assert records.eval_pass_rate(2, report) == 0.5  # the primary (first) set's greedy rate
    assert [row["eval_set"] for row in records.evals.read().to_pylist()] == ["main", "hard"]


def test_perf_metrics_split_the_step_by_its_marks() -> None:
    # marks (s): wait 10 -> 12 (take), train 12 -> 15, publish 15 -> 16 (the snapshot):
    # train_s = 15 - 12 + 1 = 4 (train + publish), step = 2 + 4 = 6, wait_frac = 2 / 6
    perf = perf_metrics(10.0, 12.0, 15.0, 16.0, checkpoint_s=None)
    assert perf == {
        M.PERF_LEARNER_STEP_S: 6.0,
        M.PERF_LEARNER_WAIT_FRAC: pytest.approx(1 / 3, rel=1e-12),
        M.PERF_LEARNER_TRAIN_S: 3.0,
        M.PERF_WEIGHT_PUBLISH_S: 1.0,
    }
    # the previous checkpoint's seconds ride along on the next step only
    assert perf_metrics(10.0, 12.0, 15.0, 16.0, checkpoint_s=0.5)[M.PERF_CHECKPOINT_S] == 0.5
    assert math.isclose(perf_metrics(0.0, 0.0, 0.0, 0.0, None)[M.PERF_LEARNER_WAIT_FRAC], 0.0)


def test_rollout_rows_are_the_samples_of_the_logged_groups(tmp_path: Path) -> None:
    """One row per sample with the group's version on every token, lag against the learner's
    version at the step (step - 1), text from the decoder (null without one); the log's parts
    are truncated and vouched for with the other records."""
    records = StepRecords(tmp_path)
    groups = random_groups(2, 3, seed=1, version=1)
    decode = TextDecoder(prompt=lambda ids: f"P{list(ids)}", response=lambda ids: f"R{list(ids)}")
    _write_steps(records, range(4))
    for step in (2, 3):
        logged = rollouts_to_log(RolloutLogConfig(), step, 3, groups, decode if step == 2 else None)
        records.append(step, 0.0, {}, None, logged)
    rows = records.rollouts.read().to_pylist()
    assert [(r["step"], r["group_id"], r["sample_index"]) for r in rows] == [
        (step, g, i) for step in (2, 3) for g in ("g0", "g1") for i in range(3)
    ]
    first = rows[0]
    assert first["policy_version"] == 1 and first["lag"] == 0 and rows[-1]["lag"] == 1
    assert first["response_ids"] == groups[0].response_ids[0].tolist()
    assert first["token_versions"] == [1] * len(first["response_ids"])
    assert first["prompt_text"] == f"P{groups[0].prompt_ids.tolist()}"
    assert first["response_text"] == f"R{first['response_ids']}"
    assert first["reward"] == groups[0].rewards[0]
    assert first["behavior_logprobs"] == pytest.approx(groups[0].behavior_logprobs[0].tolist())
    assert rows[-1]["prompt_text"] is None and rows[-1]["response_text"] is None
    assert "rollouts.parquet/part-000002.parquet" in records.vouched(2)
    assert "rollouts.parquet/part-000003.parquet" not in records.vouched(2)
    records.truncate_after(2)
    assert records.rollouts.steps() == [2]


def test_the_option_picks_steps_and_a_share_of_groups() -> None:
    groups = random_groups(40, 2)
    groups = [dataclasses.replace(g, group_id=f"s3-b0-p{i}") for i, g in enumerate(groups)]
    every_third = RolloutLogConfig(every=3)
    assert [s for s in range(1, 8) if rollouts_to_log(every_third, s, 7, groups, None)] == [
        1, 4, 7
    ]  # fmt: skip
    assert rollouts_to_log(RolloutLogConfig(every=0), 1, 7, groups, None) is None
    half = rollouts_to_log(RolloutLogConfig(share=0.5), 1, 7, groups, None)
    kept = [g.group_id for g in half.groups]
    assert kept == [g.group_id for g in groups if is_logged_group(g.group_id, 0.5)]
    assert 10 < len(kept) < 30  # about half, in trained order
    with pytest.raises(ValidationError):
        RolloutLogConfig(share=0)
    with pytest.raises(ValidationError):
        RolloutLogConfig(every=-1)


def test_token_versions_are_the_records_own_when_it_carries_them(tmp_path: Path) -> None:
    """A partial rollout's tokens span versions (rollout records v3): the log keeps them."""
    [group] = random_groups(1, 2, seed=3, version=2)
    if "token_versions" not in {f.name for f in dataclasses.fields(group)}:
        pytest.skip("this build's rollout record has no per-token versions")
    spans = [[2] + [3] * (len(r) - 1) for r in group.response_ids]
    group = dataclasses.replace(group, token_versions=spans)
    records = StepRecords(tmp_path)
    records.append(4, 0.0, {}, None, rollouts_to_log(RolloutLogConfig(), 4, 4, [group], None))
    rows = records.rollouts.read().to_pylist()
    assert [r["token_versions"] for r in rows] == spans
    assert {r["policy_version"] for r in rows} == {2} and {r["lag"] for r in rows} == {1}
