"""Family metrics (`contract.metrics.FAMILY_REDUCTIONS`) in a trial's metrics.parquet: columns
after the registered ones, read back with them and logged to MLflow like them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from contract import metrics as M
from harness.experiment.trial_runs import metric_batches
from learner.runtime.metrics_log import MetricsLog


def test_per_layer_columns_round_trip_and_reach_mlflow(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path)
    layers = [M.moe_routing_change_layer(i) for i in range(2)]
    for step, shares in ((1, (0.5, 0.25)), (2, (0.0, 1.0))):
        log.append(
            step,
            10.0 + step,
            {M.MOE_ROUTING_CHANGE_FRAC: 0.375, **dict(zip(layers, shares, strict=True))},
        )
    table = log.read()
    assert table.column_names[-2:] == layers  # after every registered metric, in name order
    assert table.column(layers[1]).to_pylist() == [0.25, 1.0]
    assert math.isnan(table.column(M.REWARD_MEAN).to_pylist()[0])  # unmeasured: NaN as ever
    logged = {(m.key, m.step): m.value for batch in metric_batches(table, 0) for m in batch}
    assert logged[(layers[0], 2)] == 0.0 and logged[(layers[1], 1)] == 0.25


def test_unregistered_names_are_still_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match=r"not in contract\.metrics"):
        MetricsLog(tmp_path).append(1, 0.0, {"moe/routing_change_frac/layer_1": 0.5})
