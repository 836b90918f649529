"""Across-seed trajectories: eval learning curves with bands, and binned per-step diagnostics.

Curves aggregate at each step over the seeds that have a value there, so a diverged seed drops
out of later steps; figures say so in their caption.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from analysis.stats import BootstrapSpec, aggregate_interval, iqm
from analysis.summary import row
from contract import metrics as mn

CURVE_COLUMNS = ["arm", "lag", "trial_name", "seed", "step", "value"]
BAND_COLUMNS = ["iqm", "low", "high", "n"]
AGG_COLUMNS = ["arm", "lag", "step", *BAND_COLUMNS]


def trial_curves(metrics: pd.DataFrame, trials: pd.DataFrame, column: str) -> pd.DataFrame:
    """Long table of one metric's finite values for the given trials (their arm labels)."""
    if column not in metrics.columns or trials.empty:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    labels = trials.set_index("trial_name")["arm"]
    rows = metrics[metrics["trial_name"].isin(labels.index)]
    rows = rows[np.isfinite(rows[column].to_numpy(dtype=float))]
    out = rows[["trial_name", "seed", "lag", mn.STEP, column]].rename(
        columns={mn.STEP: "step", column: "value"}
    )
    out["arm"] = out["trial_name"].map(labels)
    return out[CURVE_COLUMNS].reset_index(drop=True)


def bin_steps(curves: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """Average each trial's values within at most `max_points` equal-width step bins.

    Bins share edges across trials so seeds line up; each bin is labelled by its midpoint.
    """
    if curves.empty or curves["step"].nunique() <= max_points:
        return curves
    lo, hi = float(curves["step"].min()), float(curves["step"].max())
    edges = np.linspace(lo, hi, max_points + 1)
    idx = np.clip(
        np.searchsorted(edges, curves["step"].to_numpy(float), side="right") - 1, 0, max_points - 1
    )
    mids = (edges[:-1] + edges[1:]) / 2
    binned = curves.assign(step=mids[idx])
    keys = ["arm", "lag", "trial_name", "seed", "step"]
    return binned.groupby(keys, as_index=False, sort=True)["value"].mean()[CURVE_COLUMNS]


def iqm_bands(curves: pd.DataFrame, keys: list[str], spec: BootstrapSpec | None) -> pd.DataFrame:
    """IQM across seeds of `value` at each point `keys` name (arm, lag and a step or budget), with
    a bootstrap band when `spec` is given: columns `keys` + BAND_COLUMNS, one row per point.

    Every curve of the report (learning curves, diagnostics, compute-matched) is banded here,
    so a point's band means the same in each figure.
    """
    out = []
    for key, group in curves.groupby(keys, sort=True):
        values = group["value"].to_numpy(dtype=float)
        if spec is None:
            out.append((*key, float(iqm(values)), np.nan, np.nan, len(values)))
            continue
        interval = aggregate_interval(values, "iqm", spec)
        out.append((*key, interval.value, interval.low, interval.high, interval.n))
    return pd.DataFrame(out, columns=[*keys, *BAND_COLUMNS])


def aggregate_curves(curves: pd.DataFrame, spec: BootstrapSpec | None) -> pd.DataFrame:
    """IQM across seeds at each (arm, lag, step); a bootstrap band when `spec` is given."""
    return iqm_bands(curves, ["arm", "lag", "step"], spec)


def band_rows(bands: pd.DataFrame, section: str, label: Callable[[Any], str]) -> list[dict]:
    """Summary rows of `iqm_bands` output, one per point; `label(point)` (a row of `bands`)
    is its `comparison`, the point's place on the curve for the reader."""
    return [
        row(
            section,
            "iqm",
            r.iqm,
            arm=str(r.arm),
            lag=int(r.lag),
            comparison=label(r),
            ci_low=r.low,
            ci_high=r.high,
            n=int(r.n),
        )
        for r in bands.itertuples(index=False)
    ]


def curve_rows(aggregated: pd.DataFrame, section: str) -> list[dict]:
    """Summary rows for an aggregated curve; the step goes in `comparison` as 'step N'."""
    return band_rows(aggregated, section, lambda r: f"step {r.step:g}")
