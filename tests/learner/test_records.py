"""The learner's step records (learner.runtime.records.StepRecords: metric rows, eval rows,
ledger) and a step's perf/* timings (learner.runtime.step_metrics.perf_metrics)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from contract import metrics as M
from contract.evals import EvalReport, EvalSetScore
from learner.runtime.records import StepRecords
from learner.runtime.step_metrics import perf_metrics


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
