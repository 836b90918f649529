"""The report's numbers did not move when analysis/ was reorganised (one statistics core,
report sections as modules).

`data/report_golden.parquet` is the `summary.parquet` of the report of one fixed synthetic
experiment, written by the code *before* the reorganisation (run this file as a script to
rewrite it: `python tests/analysis/test_report_unchanged.py`). The experiment exercises every
section: 3 arms, 4 seeds, 2 lags, staleness drops (bounded mode), correction and MoE metrics,
two eval sets with pass@k, generated tokens, a diverged and a failed trial (so one cell has 3
seeds and its IQM is a plain mean, and another has 4).

Deterministic numbers (point estimates, p-values of the non-bootstrap tests, power, counts,
Wilson intervals) must agree to 1e-9. Bootstrap interval bounds must agree within a Monte-Carlo
tolerance, see `mc_tolerance`. In fact the statistics core replays the old engines' random draws
(one `rng.integers(0, n_j, (B, n_j))` per stratum in order from `default_rng(seed)`, as
`scipy.stats.bootstrap` and the old hand-written resampler both did), so with the same numpy the
draws are bitwise identical: when this test was written every bound agreed to 1.1e-16 (one ulp,
where scipy's `stats.quantile` and `np.percentile` round the interpolation differently), and the
report's Markdown differed only in the changes made on purpose. The tolerance only guards
against a numpy that changes the Generator's stream.

Rewritten on purpose since: when the report gained the Findings section (rows `findings`), the
paired t-test (`paired_t_p`, `paired_t_p_holm` in `tests_*`), the smallest detectable difference
in score units (`power` / `min_detectable_diff`) and compact seeds in What to do next
(`range(a,b)`, no command past 50 seeds: `next_steps` notes, and the 'every comparison' need).
Every other row of the old file was checked unchanged: same keys, values, intervals and notes
(up to `NEW_NOTES`). Rewritten again when wall-clock axes started counting from each trial's
first learner update instead of its start (`analysis.wall_clock`): the `seconds ...` rows of
`compute_curves` and `compute_matched` moved (start-up no longer on the axis), and the Trials
section gained `startup_s` per (arm, lag); every other row was checked bitwise unchanged.
Rewritten again when Stability gained collapse (rows `collapse`, `collapse_tests`, and
`peak_drop` in `stability`): the 1,510 earlier rows were checked bitwise unchanged.
Rewritten again when the Findings gained AUC lines, lag lines and margin tests under one Holm
family (sections `findings_auc`, `claims`, `lag_tests_*`, `max_safe_lag`; `tost_p` in
`tests_*`; `kl_behavior_mean` in `staleness`) and the front counted only detected score
differences: of the 1,531 earlier rows, only the Findings' notes and verdicts (the larger Holm
family) and 3 Pareto flags moved; every other row was checked bitwise unchanged.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import ReportConfig, build_report
from analysis.stats import IQM_IS_MEAN_NOTE
from analysis.synthetic import SyntheticSpec, write_experiment

GOLDEN = Path(__file__).parent / "data" / "report_golden.parquet"
SPEC = SyntheticSpec(
    skill={"gspo": 0.7, "grpo": 0.6, "ppo": 0.5},
    seeds=(0, 1, 2, 3),
    lags=(0, 2),
    steps=30,
    eval_every=10,
    rows_per_part=8,
    diverged=(("grpo", 1, 2, 15),),
    failed=(("gspo", 2, 0),),
    mode="bounded",
    corrections=True,
    eval_sets=("heldout", "hard"),
    tokens_per_step=1000.0,
)
CONFIG = ReportConfig(n_resamples=1000, curve_resamples=200, make_figures=False)
KEYS = ["section", "arm", "lag", "comparison", "statistic"]
# Sections whose intervals are closed-form (Wilson), not bootstrap: compared to 1e-9.
CLOSED_FORM_CI = {"divergence", "collapse", "time_to_threshold"}
# Curves are bootstrapped with `curve_resamples`, every other interval with `n_resamples`.
CURVE_SECTIONS = {"learning_curve", "compute_curves", "compute_matched"}
# A bound more than this many Monte-Carlo standard errors away means a different estimator.
MC_STANDARD_ERRORS = 6.0
# Notes added on purpose (checked in sections/test_final_scores.py).
NEW_NOTES = (IQM_IS_MEAN_NOTE,)
ROOT = "<ROOT>"


def summary_of(tmp: Path) -> pd.DataFrame:
    """The report summary of SPEC, its experiment path replaced by a placeholder, in key order."""
    root = write_experiment(tmp / "exp", SPEC)
    summary = build_report(root, tmp / "report", CONFIG).summary
    summary = summary.assign(note=summary["note"].str.replace(str(root.resolve()), ROOT))
    summary = summary.assign(note=summary["note"].str.replace(str(root), ROOT))
    return summary.sort_values(KEYS, na_position="first", kind="stable").reset_index(drop=True)


def mc_tolerance(width: np.ndarray, n_resamples: int) -> np.ndarray:
    """Allowed |difference| of a percentile-bootstrap bound, from the golden interval's width.

    The MC standard error of the p-quantile of B draws is sqrt(p (1 - p) / B) / f(q_p)
    (asymptotic variance of a sample quantile). For a near-normal bootstrap distribution with
    spread s, f(q_0.025) = phi(1.96) / s = 0.058 / s, so SE = 0.156 s / 0.058 / sqrt(B) =
    2.7 s / sqrt(B); the 95% interval is 3.92 s wide, so SE = 0.69 width / sqrt(B). Six SEs:
    4.1 width / sqrt(B), i.e. 0.13 of the width at B = 1000 and 0.29 at B = 200.
    """
    return MC_STANDARD_ERRORS * 0.69 * width / math.sqrt(n_resamples) + 1e-9


def strip_new_notes(notes: pd.Series) -> pd.Series:
    out = notes.fillna("")
    for note in NEW_NOTES:
        out = out.str.replace(f"; {note}", "", regex=False).str.replace(note, "", regex=False)
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, pd.DataFrame]:
    new = summary_of(tmp_path_factory.mktemp("unchanged"))
    return pd.read_parquet(GOLDEN), new


def test_same_rows(pair) -> None:
    old, new = pair
    assert len(new) == len(old)
    pd.testing.assert_frame_equal(new[KEYS], old[KEYS], check_dtype=False)
    assert (new["n"].fillna(-1) == old["n"].fillna(-1)).all()


def test_values_exact(pair) -> None:
    # Every `value` is a point estimate or a closed-form number: nothing here is resampled.
    old, new = pair
    np.testing.assert_allclose(new["value"], old["value"], rtol=1e-9, atol=1e-12)


def test_closed_form_intervals_exact(pair) -> None:
    old, new = pair
    rows = old["section"].isin(CLOSED_FORM_CI)
    for bound in ("ci_low", "ci_high"):
        np.testing.assert_allclose(new.loc[rows, bound], old.loc[rows, bound], atol=1e-9)


def test_bootstrap_intervals_within_monte_carlo_error(pair) -> None:
    old, new = pair
    rows = ~old["section"].isin(CLOSED_FORM_CI)
    assert (new.loc[rows, "ci_low"].isna() == old.loc[rows, "ci_low"].isna()).all()
    width = (old["ci_high"] - old["ci_low"]).fillna(0).to_numpy()
    curve = old["section"].isin(CURVE_SECTIONS).to_numpy()
    tol = np.where(
        curve,
        mc_tolerance(width, CONFIG.curve_resamples),
        mc_tolerance(width, CONFIG.n_resamples),
    )
    for bound in ("ci_low", "ci_high"):
        diff = (new[bound] - old[bound]).abs().fillna(0).to_numpy()
        assert (diff[rows.to_numpy()] <= tol[rows.to_numpy()]).all(), bound


def test_notes_unchanged(pair) -> None:
    old, new = pair
    # Whether two leaders' intervals overlap depends on the draws: compare up to the verdict.
    matched = old["section"] == "compute_matched"
    old_notes, new_notes = strip_new_notes(old["note"]), strip_new_notes(new["note"])
    old_notes[matched] = old_notes[matched].str.split(";").str[0]
    new_notes[matched] = new_notes[matched].str.split(";").str[0]
    pd.testing.assert_series_equal(new_notes, old_notes, check_dtype=False, check_names=False)


if __name__ == "__main__":  # rewrite the golden file from the current code
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        frame = summary_of(Path(tmp))
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(GOLDEN, index=False)
    print(f"wrote {GOLDEN}: {len(frame)} rows, {GOLDEN.stat().st_size} bytes", file=sys.stderr)
