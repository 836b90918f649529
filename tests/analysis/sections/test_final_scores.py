"""Section "Scores": the table says when an IQM is just the mean (fewer than 4 values)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis import ReportConfig, build_report
from analysis.stats import IQM_IS_MEAN_NOTE, BootstrapSpec, aggregate_interval, stratified_interval
from analysis.synthetic import SyntheticSpec, write_experiment

SPEC = BootstrapSpec(n_resamples=200)
TABLES_ONLY = ReportConfig(n_resamples=200, curve_resamples=100, make_figures=False)


def test_iqm_note_below_four_values_only() -> None:
    # trim_mean(0.25) cuts int(0.25 n) per end: 0 for n = 3 (IQM = mean), 1 for n = 4.
    three = aggregate_interval([0.1, 0.2, 0.9], "iqm", SPEC)
    assert three.note == IQM_IS_MEAN_NOTE and three.value == np.mean([0.1, 0.2, 0.9])
    assert aggregate_interval([0.1, 0.2, 0.9, 1.0], "iqm", SPEC).note == ""
    assert aggregate_interval([0.1, 0.2, 0.9], "mean", SPEC).note == ""
    # pooled over strata: 2 + 2 = 4 values are trimmed, so no note
    assert stratified_interval([[0.1, 0.2], [0.9, 1.0]], "iqm", SPEC).note == ""


def test_report_table_notes_small_cells(tmp_path: Path) -> None:
    # gspo lag 0 loses a seed (3 values); every other cell has 4.
    spec = SyntheticSpec(
        skill={"gspo": 0.7, "grpo": 0.6}, seeds=(0, 1, 2, 3), lags=(0,), steps=20,
        failed=(("gspo", 3, 0),),
    )  # fmt: skip
    result = build_report(write_experiment(tmp_path / "exp", spec), tmp_path / "out", TABLES_ONLY)
    final = result.summary[result.summary["section"] == "final_score"]
    noted = final[final["note"].str.contains(IQM_IS_MEAN_NOTE, regex=False)]
    assert set(zip(noted["arm"], noted["statistic"], strict=True)) == {("gspo", "iqm")}
    table = result.markdown_path.read_text().split("### Final score", 1)[1].split("###", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.count("|") > 3}
    assert IQM_IS_MEAN_NOTE in rows["gspo"] and IQM_IS_MEAN_NOTE not in rows["grpo"]
