"""An arm's own staleness regime (`arms[].staleness`: lags, partial_rollouts, sync_every).

A regime other than the experiment's is compared as an arm of its own. Each field overrides the
experiment's `staleness` section for that arm only, in every reader: the grid (which lags the
arm runs at), the generators (partial rollouts, sync interval), the learner's intake (how stale
a group may be), the buffer-depth rule and the report's policy column; unset, the arm runs as
the experiment says and every config keeps its hash. Bad values are refused naming the field.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from contract.layout import TrialPaths
from contract.trial import TrialSpec
from harness.cli_trial import _trial_spec
from harness.config import ConfigError, load_config, resolved_dump
from harness.experiment.grid import expand_trials
from harness.staleness_regimes import Regime
from harness.trial.learner_main import learner_task

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs/quickstart.yaml"
BOUNDED = ["staleness.mode=bounded", "staleness.lags=[0,1,2]", "generation.backend=torch"]


def _load(*overrides: str):
    return load_config(QUICKSTART, [*BOUNDED, *overrides])


def test_each_field_overrides_the_experiment_for_its_arm_only() -> None:
    cfg = _load(
        "staleness.partial_rollouts=true",  # the experiment's default, which one arm turns off
        "arms.grpo.staleness.partial_rollouts=false",
        "arms.grpo.staleness.lags=[1,2]",
        "arms.ppo.staleness.sync_every=3",
    )
    assert cfg.regime("gspo") == Regime(lags=(0, 1, 2), partial_rollouts=True, sync_every=1)
    assert cfg.regime("grpo") == Regime(lags=(1, 2), partial_rollouts=False, sync_every=1)
    assert cfg.regime("ppo") == Regime(lags=(0, 1, 2), partial_rollouts=True, sync_every=3)
    assert cfg.regime("ppo").oldest == 2 + 3 - 1
    # the grid runs each arm at its own lags only, seed-major as before
    names = [t.trial_name for t in expand_trials(cfg) if t.seed == 0]
    assert [n for n in names if n.startswith("grpo__")] == [
        "grpo__seed0__lag1__bounded",
        "grpo__seed0__lag2__bounded",
    ]
    assert sum(n.startswith("gspo__") for n in names) == 3


def test_an_unset_regime_keeps_every_config_and_its_hash() -> None:
    default = load_config(QUICKSTART)
    assert all("staleness" not in arm for arm in resolved_dump(default)["arms"])
    assert default.regime("grpo") == Regime(lags=(0,), partial_rollouts=False, sync_every=1)
    own = load_config(QUICKSTART, ["arms.grpo.staleness.sync_every=2"])
    assert resolved_dump(own)["arms"][1]["staleness"] == {"sync_every": 2}
    assert own.config_hash() != default.config_hash()
    # as the arm's own field or as the experiment's, a config resolves to itself
    again = load_config(QUICKSTART, ["arms.grpo.staleness={sync_every: 2}"])
    assert again.config_hash() == own.config_hash()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["arms.grpo.staleness.lags=[3]"], r"arms\[1\]\.staleness\.lags of arm 'grpo' has \[3\]"),
        (["arms.grpo.staleness.lags=[1,1]"], r"arms\.1\.staleness: .*duplicates"),
        (["arms.grpo.staleness.lags=[-1]"], r"arms\.1\.staleness: .*>= 0"),
        (["arms.grpo.staleness.lags=[]"], r"arms\.1\.staleness\.lags"),
        (["arms.grpo.staleness.sync_every=0"], r"arms\.1\.staleness\.sync_every"),
        (["arms.grpo.staleness.partial=true"], r"arms\.1\.staleness\.partial: Extra inputs"),
        (
            ["staleness.mode=fixed", "arms.grpo.staleness.partial_rollouts=true"],
            r"arms\[1\]\.staleness\.partial_rollouts of arm 'grpo' needs staleness\.mode: bounded",
        ),
    ],
)
def test_bad_regimes_are_refused_by_name(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(*overrides)


def test_the_buffer_depth_rule_reads_the_stalest_arm() -> None:
    """Groups of an arm syncing every 8 steps may wait 7 versions longer than the lag allows."""
    fits = ["buffer.max_depth=80", "learner.checkpoint_every=1"]  # (1 + 2 + 2) x 16
    _load(*fits)
    with pytest.raises(ConfigError, match=r"buffer\.max_depth=80 is too small.* = 192 may wait"):
        _load(*fits, "arms.ppo.staleness.sync_every=8")


def test_a_trial_of_a_partial_arm_is_refused_in_fixed_mode() -> None:
    cfg = _load("arms.grpo.staleness.partial_rollouts=true")
    with pytest.raises(typer.Exit):
        _trial_spec(cfg, "grpo", 0, 1, "fixed")
    assert _trial_spec(cfg, "grpo", 0, 1, "bounded").mode == "bounded"
    assert _trial_spec(cfg, "gspo", 0, 1, "fixed").mode == "fixed"  # its regime has none


def test_the_learner_admits_groups_as_stale_as_its_arms_sync_interval(tmp_path: Path) -> None:
    """The learner's intake reads the arm's sync interval (bounded: max lag + k - 1)."""
    cfg = _load("arms.grpo.staleness.sync_every=3")
    for arm, sync_every in (("grpo", 3), ("gspo", 1)):
        spec = TrialSpec(arm=arm, seed=0, lag=1, mode="bounded")
        task = learner_task(cfg, spec, TrialPaths(tmp_path / arm), steps=2)
        assert (task.sync_every, task.max_lag) == (sync_every, 1 + sync_every - 1)
