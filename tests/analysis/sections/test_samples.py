"""Section "Sample completions" (analysis.sections.samples): a few completions per arm from the
trials' rollout logs, at the first and last logged step, shown as literal text in both formats,
and nothing at all when no trial has a rollout log."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from analysis import ReportConfig, build_report
from analysis.sections.samples import PROMPTS, RESPONSES
from analysis.synthetic import SyntheticSpec, rollouts_parts, write_experiment
from contract import rollout_log as R
from contract import step_tables
from contract.layout import ExperimentPaths

SPEC = SyntheticSpec(
    skill={"gspo": 0.7, "grpo": 0.55},
    seeds=(0, 1),
    lags=(0, 2),
    steps=10,
    eval_every=5,
    rollouts=True,
)
# A completion a Markdown or HTML reader must not interpret: markup, a pipe, backticks, a
# line break, an emphasis marker.
NASTY = "<script>alert(1)</script> | `x` **bold**\nnext"


def _report(root: Path):
    return build_report(root, config=ReportConfig(make_figures=False))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = write_experiment(tmp_path_factory.mktemp("samples"), SPEC)
    # gspo seed 0 lag 0 is the trial gspo shows: its first response of its first step is NASTY
    paths = ExperimentPaths(root).trial("gspo-s0-lag0")
    part = rollouts_parts(SPEC, "gspo", 0, 0, SPEC.steps)[1].to_pylist()
    part[0][R.RESPONSE_TEXT] = NASTY
    columns = {name: [r[name] for r in part] for name in R.ROLLOUT_LOG_SCHEMA.names}
    step_tables.write_part(paths.rollouts, 1, R.rollout_table(columns))
    return _report(root)


def test_each_arm_shows_its_first_trials_prompts_at_the_first_and_last_step(report) -> None:
    rows = report.summary[report.summary["section"] == "samples"]
    assert set(rows["arm"]) == {"gspo", "grpo"}
    assert set(rows["lag"]) == {0} and {s[0] for s in rows["seeds"]} == {0}  # the first trial
    prompts = rows[rows["statistic"] == "group_reward_mean"]
    responses = rows[rows["statistic"] == "reward"]
    assert len(prompts) == 2 * 2 * PROMPTS  # arms x (first, last step) x prompts
    assert len(responses) == len(prompts) * RESPONSES
    assert set(prompts["n"]) == {4}  # each group's mean is over all its samples
    steps = {c.split(",")[0] for c in prompts["comparison"]}
    assert steps == {"step 1", f"step {SPEC.steps}"}
    # matched prompts: every arm shows the same prompts at a step
    by_arm = prompts.groupby("arm")["note"].apply(list)
    assert by_arm["gspo"] == by_arm["grpo"]


def test_completions_are_escaped_text_in_markdown_and_html(report) -> None:
    md, html = report.markdown_path.read_text(), report.html_path.read_text()
    assert "## Sample completions" in md and "<h2>Sample completions</h2>" in html
    # Markdown: a code span, the pipe escaped for the table, the line break shown as a mark
    assert "``<script>alert(1)</script> \\| `x` **bold**⏎next``" in md
    # HTML: every character escaped, nothing of it live
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; | `x` **bold**⏎next" in html
    assert "What is" in md and "&lt;answer&gt;" in html


def test_no_rollout_log_no_section(tmp_path: Path) -> None:
    root = write_experiment(tmp_path, dataclasses.replace(SPEC, rollouts=False))
    result = _report(root)
    assert not (result.summary["section"] == "samples").any()
    assert "Sample completions" not in result.markdown_path.read_text()
