"""`harness report` says in one line when its trials were made under different software, naming
the lock and the packages that differ; a resumed trial says so too (contract.environment)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analysis import ReportConfig, build_report
from analysis.synthetic import write_experiment
from contract.record import TrialRecord
from harness.cli import app
from harness.provenance import provenance
from harness.trial.prepare import _provenance_of_attempt
from tests.analysis.experiments import TWO_ARMS

TABLES_ONLY = ReportConfig(n_resamples=200, curve_resamples=100, make_figures=False)
SPEC = replace(TWO_ARMS, seeds=(0, 1), lags=(0,), steps=10, diverged=())


@pytest.fixture(scope="module")
def facts() -> dict:
    """This environment's real provenance: every package and the lock it matches."""
    return provenance()


def _set_provenance(root: Path, facts: dict, changed: dict[str, dict]) -> None:
    """Every trial records `facts`; the trials named in `changed` record its entries over them."""
    for trial_json in sorted((root / "trials").glob("*/trial.json")):
        info = json.loads(trial_json.read_text())
        info["provenance"] = facts | changed.get(trial_json.parent.name, {})
        trial_json.write_text(json.dumps(info))


def test_one_environment_gives_no_line(tmp_path: Path, facts: dict) -> None:
    root = write_experiment(tmp_path / "exp", SPEC)
    _set_provenance(root, facts, {})
    result = build_report(root, tmp_path / "out", TABLES_ONLY)
    assert result.software_note is None
    assert "different software" not in result.markdown_path.read_text()


def test_a_trial_under_another_torch_and_lock_is_named(tmp_path: Path, facts: dict) -> None:
    root = write_experiment(tmp_path / "exp", SPEC)
    other_lock = {"name": "cpu", "sha256": "f" * 64, "departures": []}
    other = {"packages": facts["packages"] | {"torch": "2.14.1"}, "lock": other_lock}
    _set_provenance(root, facts, {"grpo-s1-lag0": other})
    result = build_report(root, tmp_path / "out", TABLES_ONLY)
    note = result.software_note
    assert note is not None and note.startswith("the 4 trials were made under different software")
    torch = facts["packages"]["torch"]
    assert f"torch ({torch}: 3, 2.14.1: 1)" in note  # the package, its versions and counts
    assert f"lock cpu@{'f' * 12}: 1" in note
    assert note in result.markdown_path.read_text()  # under the report's Warnings
    # The command prints it too.
    cli = CliRunner().invoke(app, ["report", str(root), "--out", str(tmp_path / "cli")])
    assert cli.exit_code == 0, cli.output
    assert "different software" in cli.output and "torch" in cli.output


def test_a_resumed_trial_says_what_changed_and_keeps_it(
    facts: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    earlier = facts | {"packages": facts["packages"] | {"numpy": "1.26.4"}}
    record = TrialRecord(arm="gspo", seed=0, lag=0, mode="fixed", status="running")
    now = _provenance_of_attempt(record.model_copy(update={"provenance": earlier}))
    line = f"numpy 1.26.4 -> {facts['packages']['numpy']}"
    assert line in capsys.readouterr().out
    assert len(now["software_changes"]) == 1 and line in now["software_changes"][0]
    # Resumed again under the same software: no new line, the history stays.
    again = _provenance_of_attempt(record.model_copy(update={"provenance": now}))
    assert capsys.readouterr().out == ""
    assert again["software_changes"] == now["software_changes"]
    # Not a resume: nothing to compare.
    assert "software_changes" not in _provenance_of_attempt(None)
