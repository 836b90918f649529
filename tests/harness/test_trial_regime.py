"""The regime a trial's record carries is resolved from the config once, off the defaults:
the experiment's staleness section, an arm's own fields on top, and the arm's correction."""

from __future__ import annotations

from pathlib import Path

from contract.trial import TrialSpec
from harness.config import load_config_data, validate_config
from harness.trial.prepare import trial_regime

REPO = Path(__file__).resolve().parents[2]


def test_the_record_s_regime_is_the_arm_s_resolved_one() -> None:
    data = load_config_data(REPO / "configs/quickstart.yaml")
    data["staleness"] = {"mode": "bounded", "lags": [0, 2], "sync_every": 3}
    data["arms"] = [
        {"name": "gspo", "objective": "gspo", "correction": "tis_token"},
        {
            "name": "grpo_partial",
            "objective": "grpo",
            "staleness": {"partial_rollouts": True, "sync_every": 1, "lags": [2]},
        },
    ]
    cfg = validate_config(data)
    shared = trial_regime(cfg, TrialSpec("gspo", 0, 2, "bounded"))
    assert shared.model_dump() == {
        "mode": "bounded",
        "lag": 2,
        "partial_rollouts": False,
        "sync_every": 3,
        "correction": "tis_token",
    }
    own = trial_regime(cfg, TrialSpec("grpo_partial", 1, 2, "bounded"))
    assert (own.partial_rollouts, own.sync_every, own.correction) == (True, 1, "")
    assert own.words() == "bounded, max lag 2, partial rollouts"
