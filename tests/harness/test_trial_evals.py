"""Eval suites in real trials (torch generator, fixed mode): a row per (eval step, eval set),
the primary set's greedy rate is eval/pass_rate, reruns repeat the rows bitwise, and adding
eval sets changes nothing the trial trains on. The trial without eval sets is the session's
shared `grpo_two_steps` (tests/harness/conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from contract import metrics as M
from contract.layout import PARENT_TAG
from harness.config import load_config
from harness.experiment.grid import classify_trials, expand_trials
from harness.experiment.request import ExperimentRequest
from harness.experiment.tracking import MlflowTracker
from learner.runtime.evals_log import EvalsLog
from tests.harness.mlflow_store import fresh_sqlite_store, template_store
from tests.harness.shared_trials import GRPO_TWO_STEPS, NO_EVALS, Recipe
from tests.harness.trial_helpers import REPO, deterministic_columns, metrics, run_trial

pytestmark = pytest.mark.e2e

STEPS = 2  # with SMALL's eval_every=2: evals after 0 and 2 steps
TWO_SETS = (
    "evals=[{name: main}, {name: prefixed, task: {name: addition, eval_size: 8, "
    "system_prompt: q}}]",
    "eval.samples=4",
    "eval.pass_k=[1, 4]",
)
# The shared trial is this module's trial without eval sets, at its own steps.
assert Recipe("grpo", STEPS, extra=NO_EVALS) == GRPO_TWO_STEPS


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, grpo_two_steps: Path) -> dict[str, Path]:
    """Two runs with eval sets, and the shared one without (all read-only)."""
    outs = {}
    for name in ("first", "again"):
        out = tmp_path_factory.mktemp(name)
        result = run_trial(out, "grpo", steps=STEPS, extra=TWO_SETS)
        assert result.returncode == 0, result.stdout + result.stderr
        outs[name] = out
    return outs | {"plain": grpo_two_steps}


def evals(out: Path) -> pd.DataFrame:
    return EvalsLog(out).read().to_pandas()


def test_a_row_per_eval_step_and_set(runs: dict[str, Path]) -> None:
    table = evals(runs["first"])
    assert list(zip(table["step"], table["eval_set"], strict=True)) == [
        (0, "main"), (0, "prefixed"), (2, "main"), (2, "prefixed"),
    ]  # fmt: skip
    assert table["n_prompts"].tolist() == [16, 8, 16, 8]  # task.eval_size=16 (SMALL), 8
    assert (table["samples"] == 4).all()
    assert ((table["pass_at_4"] >= table["pass_at_1"]) & (table["pass_at_1"] >= 0)).all()
    assert (table["pass_at_1"] - table["pass1_sampled"]).abs().max() < 1e-12
    main = table[table["eval_set"] == "main"].set_index("step")["greedy_pass_rate"]
    rates = metrics(runs["first"])[M.EVAL_PASS_RATE]
    assert main.to_dict() == rates.loc[[0, 2]].to_dict()  # primary greedy = eval/pass_rate
    assert np.isnan(rates.loc[1])  # no eval between eval steps


def test_eval_rows_are_bitwise_reproducible(runs: dict[str, Path]) -> None:
    pd.testing.assert_frame_equal(evals(runs["first"]), evals(runs["again"]), check_exact=True)


def test_extra_eval_sets_change_nothing_trained(runs: dict[str, Path]) -> None:
    """The default single set scores and trains exactly as with extra sets and samples: eval
    sampling draws from its own generators and leaves the model's mode as it found it."""
    pd.testing.assert_frame_equal(
        deterministic_columns(metrics(runs["first"])),
        deterministic_columns(metrics(runs["plain"])),
        check_exact=True,
    )
    plain = evals(runs["plain"])
    assert plain["eval_set"].tolist() == ["heldout", "heldout"]
    assert plain["samples"].tolist() == [0, 0] and plain["pass1_sampled"].isna().all()
    assert [c for c in plain.columns if c.startswith("pass_at_")] == []


def test_generated_tokens_and_prompt_sources(runs: dict[str, Path]) -> None:
    frame = metrics(runs["first"])
    tokens = frame[M.TOKENS_GENERATED]
    assert tokens.loc[0] == 0
    # Fixed mode drops nothing: every token read was trained, 4 prompts x 4 samples a step.
    assert (tokens.loc[[1, 2]] == frame[M.LENGTH_MEAN].loc[[1, 2]] * 16).all()
    prompts = pd.read_parquet(runs["first"] / "prompts.parquet")
    sources = prompts.groupby(["split", "task"]).size().to_dict()
    assert sources == {("train", "addition"): 8, ("eval", "main"): 16, ("eval", "prefixed"): 8}


def test_eval_sets_reach_the_trials_mlflow_run(
    runs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The real trial, logged by the harness's tracker into a real SQLite store: one metric
    history per (set, score) at the eval steps, and the evals parts as artifacts."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    one_trial = ["seeds=[0]", "arms=[{name: grpo, objective: grpo}]", "staleness.lags=[0]"]
    cfg = load_config(REPO / "configs/quickstart.yaml", one_trial)
    out_dir = tmp_path / "exp"
    (spec,) = expand_trials(cfg, out_dir)
    shutil.copytree(runs["first"], spec.trial_dir)
    fresh_sqlite_store(out_dir, template_store(request.config, tmp_path_factory))
    tracker = MlflowTracker.open(cfg, out_dir)
    tracker.start_experiment(ExperimentRequest(cfg, REPO / "configs/quickstart.yaml", steps=STEPS))
    for trial in classify_trials([spec]):
        tracker.trial_done_before(trial)
    tracker.end_experiment("FINISHED")
    client = tracker.client
    (child,) = client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{tracker.parent_run_id}'"
    )
    table = evals(runs["first"])
    for eval_set in ("main", "prefixed"):
        rows = table[table["eval_set"] == eval_set]
        for score, column in (
            ("greedy_pass_rate", "greedy_pass_rate"),
            ("pass1", "pass1_sampled"),
            ("pass_at_4", "pass_at_4"),
        ):
            history = client.get_metric_history(child.info.run_id, f"eval/{eval_set}/{score}")
            assert [(m.step, m.value) for m in history] == list(
                zip(rows["step"], rows[column], strict=True)
            )
    parts = {a.path for a in client.list_artifacts(child.info.run_id, "trial/evals.parquet")}
    assert parts == {
        "trial/evals.parquet/part-000000.parquet",
        "trial/evals.parquet/part-000002.parquet",
    }
