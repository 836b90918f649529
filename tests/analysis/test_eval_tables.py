"""Reading evals.parquet: schema drift across parts, a resumed step written twice, a corrupt
part, the legacy fallback to eval/pass_rate, and per-set scoring of one trial by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.config import ReportConfig
from analysis.eval_tables import legacy_evals, read_evals, score_columns
from analysis.loading import load_experiment
from analysis.sections.eval_sets import eval_set_scores
from contract import evals as ev
from contract import metrics as mn
from contract.layout import TrialPaths


def _eval_part(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _row(step: int, name: str, greedy: float, **more: float) -> dict:
    return {ev.STEP: step, ev.EVAL_SET: name, ev.N_PROMPTS: 16, ev.GREEDY_PASS_RATE: greedy} | more


def test_parts_union_dedupe_and_config_order(tmp_path: Path) -> None:
    evals = tmp_path / "evals.parquet"
    # step 0 without sampling, later parts add pass1 and pass@4; the set order is the config's
    # (`zeta` first), not alphabetical.
    _eval_part(evals / "part-000000.parquet", [_row(0, "zeta", 0.1), _row(0, "alpha", 0.0)])
    _eval_part(
        evals / "part-000002.parquet",
        [
            _row(2, "zeta", 0.3, pass1_sampled=0.2, pass_at_4=0.5),
            _row(2, "alpha", 0.1, pass1_sampled=0.1, pass_at_4=0.3),
        ],
    )
    # a resumed learner re-wrote step 2 of zeta: the last write counts
    _eval_part(evals / "part-000003.parquet", [_row(2, "zeta", 0.35, pass1_sampled=0.25)])
    (evals / ".part-000004.parquet.tmp").write_bytes(b"half a file")  # atomic write in flight
    frame, problems = read_evals(evals)
    assert problems == []
    assert score_columns(frame) == [ev.GREEDY_PASS_RATE, ev.PASS1_SAMPLED, "pass_at_4"]
    assert list(frame[ev.EVAL_SET]) == ["zeta", "alpha", "alpha", "zeta"]
    zeta2 = frame[(frame[ev.STEP] == 2) & (frame[ev.EVAL_SET] == "zeta")].iloc[0]
    assert zeta2[ev.GREEDY_PASS_RATE] == 0.35 and math.isnan(zeta2["pass_at_4"])
    assert math.isnan(frame.iloc[0][ev.PASS1_SAMPLED])  # step 0 measured greedy only


def test_corrupt_part_is_reported_and_missing_table_is_none(tmp_path: Path) -> None:
    evals = tmp_path / "evals.parquet"
    _eval_part(evals / "part-000000.parquet", [_row(0, "heldout", 0.2)])
    (evals / "part-000001.parquet").write_bytes(b"PAR1 not really")
    frame, problems = read_evals(evals)
    assert len(frame) == 1 and len(problems) == 1 and "part-000001.parquet" in problems[0]
    assert read_evals(tmp_path / "nothing") == (None, [])


def test_legacy_trial_uses_eval_pass_rate_as_heldout() -> None:
    metrics = pd.DataFrame({mn.STEP: [0, 1, 2], mn.EVAL_PASS_RATE: [0.1, np.nan, 0.3]})
    frame = legacy_evals(metrics)
    assert list(frame[ev.EVAL_SET]) == ["heldout", "heldout"]
    assert list(frame[ev.GREEDY_PASS_RATE]) == [0.1, 0.3] and list(frame[ev.STEP]) == [0.0, 2.0]


def _trial(root: Path, name: str, status: str, with_evals: bool) -> None:
    paths = TrialPaths(root / "trials" / name)
    paths.metrics.mkdir(parents=True)
    info = {"arm": "gspo", "seed": 0, "lag": 0, "mode": "fixed", "status": status}
    info |= {"trial_name": name, "steps_planned": 4, "diverged": status == "diverged"}
    paths.metadata.write_text(json.dumps(info))
    steps = [0, 1, 2, 3] if status == "completed" else [0, 1, 2]
    rates = [0.1, np.nan, 0.3, 0.5][: len(steps)]
    table = pa.table({mn.STEP: pa.array(steps, pa.int64()), mn.EVAL_PASS_RATE: rates})
    pq.write_table(table, paths.metrics / "part-000000.parquet")
    if with_evals:
        measured = [(s, r) for s, r in zip(steps, rates, strict=True) if not math.isnan(r)]
        rows = [_row(s, "heldout", r, pass1_sampled=math.nan) for s, r in measured]
        rows += [_row(s, "hard", r / 2, pass1_sampled=r / 4) for s, r in measured]
        _eval_part(paths.evals / "part-000000.parquet", rows)


def test_per_set_scores_of_one_trial_by_hand(tmp_path: Path) -> None:
    _trial(tmp_path, "done", "completed", with_evals=True)
    _trial(tmp_path, "diverged", "diverged", with_evals=True)
    _trial(tmp_path, "old", "completed", with_evals=False)
    experiment = load_experiment(tmp_path)
    assert set(experiment.evals["trial_name"]) == {"done", "diverged", "old"}
    scored = experiment.trials.assign(scored=True)
    per_set = eval_set_scores(experiment.evals, scored, ReportConfig(last_k_evals=2))
    by = per_set.set_index(["trial_name", ev.EVAL_SET])
    # done/heldout: evals 0.1 @ 0, 0.3 @ 2, 0.5 @ 3; final = mean of the last 2 = 0.4;
    # AUC = trapezoid (0.1+0.3)/2*2 + (0.3+0.5)/2*1 = 0.8, over the span 3 -> 0.26667
    assert by.loc[("done", "heldout"), "final_greedy"] == pytest.approx(0.4, abs=1e-12)
    assert by.loc[("done", "heldout"), "auc_greedy"] == pytest.approx(0.8 / 3, abs=1e-12)
    # done/hard: greedy halves -> final 0.2; pass1 quarters: (0.075 + 0.125) / 2 = 0.1
    assert by.loc[("done", "hard"), "final_greedy"] == pytest.approx(0.2, abs=1e-12)
    assert by.loc[("done", "hard"), "final_pass1"] == pytest.approx(0.1, abs=1e-12)
    # diverged after step 2: final 0; heldout curve 0.1 @ 0, 0.3 @ 2, 0 @ 3 (drop), 0 @ 4
    # (planned end): area 0.4 + 0.15 + 0 = 0.55 over the span 4 -> 0.1375
    assert by.loc[("diverged", "heldout"), "final_greedy"] == 0.0
    assert by.loc[("diverged", "heldout"), "auc_greedy"] == pytest.approx(0.55 / 4, abs=1e-12)
    # the old trial has one set, `heldout`, from eval/pass_rate, and no sampled scores
    assert by.loc[("old", "heldout"), "final_greedy"] == pytest.approx(0.4, abs=1e-12)
    assert ("old", "hard") not in by.index and math.isnan(by.loc[("old", "heldout"), "final_pass1"])
