"""evals.parquet: one atomic part per eval step, a row per eval set, truncated on resume."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest

from contract import evals as E
from contract.evals import EvalSetScore
from learner.runtime.evals_log import EvalsLog


def scores(step: int) -> list[EvalSetScore]:
    return [
        EvalSetScore("main", 64, step / 10, 4, step / 20, {1: step / 20, 4: step / 5}),
        EvalSetScore("hard", 32, 0.0, 4, 0.0, {4: 0.0, 1: 0.0}),  # k order does not matter
    ]


def test_rows_round_trip_with_their_types(tmp_path: Path) -> None:
    log = EvalsLog(tmp_path)
    for step in (0, 2, 4):
        log.append(step, scores(step))
    table = log.read()
    assert table.schema.field(E.STEP).type == pa.int64()
    assert table.schema.field(E.EVAL_SET).type == pa.string()
    assert table.schema.field(E.SAMPLES).type == pa.int64()
    assert table.schema.field("pass_at_4").type == pa.float64()
    assert table.column_names == [
        "step", "eval_set", "n_prompts", "greedy_pass_rate", "samples", "pass1_sampled",
        "pass_at_1", "pass_at_4",
    ]  # fmt: skip
    rows = table.to_pylist()
    assert [(r["step"], r["eval_set"]) for r in rows] == [
        (0, "main"), (0, "hard"), (2, "main"), (2, "hard"), (4, "main"), (4, "hard"),
    ]  # fmt: skip
    assert rows[4] == {
        "step": 4, "eval_set": "main", "n_prompts": 64, "greedy_pass_rate": 0.4, "samples": 4,
        "pass1_sampled": 0.2, "pass_at_1": 0.2, "pass_at_4": 0.8,
    }  # fmt: skip
    assert not list(log.root.glob(".*.tmp"))  # written by rename, no leftovers


def test_truncate_after_drops_later_eval_steps(tmp_path: Path) -> None:
    log = EvalsLog(tmp_path)
    for step in (0, 2, 4):
        log.append(step, scores(step))
    log.truncate_after(2)
    assert log.steps() == [0, 2]
    assert sorted(set(log.read().column(E.STEP).to_pylist())) == [0, 2]
    log.truncate_after(-1)
    assert log.read().num_rows == 0


def test_greedy_only_rows_have_nan_sampled_scores(tmp_path: Path) -> None:
    log = EvalsLog(tmp_path)
    log.append(0, [EvalSetScore("heldout", 16, 0.25)])
    (row,) = log.read().to_pylist()
    assert (row["samples"], row["greedy_pass_rate"]) == (0, 0.25)
    assert math.isnan(row["pass1_sampled"])
    assert EvalSetScore("heldout", 16, 0.25).mlflow_metrics() == {
        "eval/heldout/greedy_pass_rate": 0.25
    }


def test_sets_must_report_the_same_k(tmp_path: Path) -> None:
    mismatched = [EvalSetScore("a", 1, 0.0, 2, 0.0, {1: 0.0}), EvalSetScore("b", 1, 0.0, 2, 0.0)]
    with pytest.raises(ValueError, match="different pass@k"):
        EvalsLog(tmp_path).append(0, mismatched)
