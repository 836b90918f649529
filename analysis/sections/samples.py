"""Section "Sample completions": what each arm's policy wrote, at the first and last logged step.

Why: the statistics say which arm scores higher; only the text says how (a format learnt, a
verifier gamed, responses that collapsed to one string). Researchers look at samples first, so
the report shows a few, from the trials' rollout logs (`<trial>/rollouts.parquet/`, columns in
`contract.rollout_log`).

Per arm, one trial: the first with a rollout log by (lag, seed), so every arm shows the same
seed and lag when they all logged it, and in fixed mode the same prompts at the same step (group
ids, hence prompts, are matched across arms). From its first and its last logged step:
PROMPTS prompts (the lowest prompt indices), each with its group's mean reward over all its
samples and its first RESPONSES responses with their rewards. Only those two parts are read,
never the whole log (on GPUs it is large). Shown only when some trial has a rollout log.

Summary rows (section `samples`), in the order the table shows them, `seeds` the trial's seed:
- `group_reward_mean`: value the mean reward of the group, n its samples, note the prompt text,
  comparison `step <s>, prompt <i>`;
- `reward`: value the response's reward, note its text, comparison
  `step <s>, prompt <i>, sample <j>`.
Texts longer than MAX_CHARS characters are cut (`…`); the whole text is in the log.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa

from analysis.render import NEWLINE_MARK, Block
from analysis.sections.base import Inputs, Page, Part, no_figures
from analysis.summary import row
from contract import rollout_log as R
from contract import step_tables
from contract.layout import TrialPaths

SECTION = "samples"
PROMPTS = 3
RESPONSES = 2
MAX_CHARS = 300
_COLUMNS = [
    R.STEP,
    R.GROUP_ID,
    R.PROMPT_INDEX,
    R.SAMPLE_INDEX,
    R.PROMPT_TEXT,
    R.RESPONSE_TEXT,
    R.REWARD,
]

METHODS: list[str] = []
draw = no_figures


def _cut(text: object) -> str:
    """The text as shown: decoded text, or a note when the trial logged tokens alone."""
    if text is None or pd.isna(text):
        return "(not decoded)"
    text = str(text)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "…"


def logged_steps(paths: TrialPaths) -> list[int]:
    """The steps of a trial's rollout log (none when it has no log)."""
    return step_tables.part_steps(paths.rollouts)


def step_samples(paths: TrialPaths, step: int) -> pd.DataFrame | None:
    """One logged step's rows (the section's columns); None when the part cannot be read (the
    section then shows the other step, or nothing for the trial)."""
    try:
        table = step_tables.read_part(paths.rollouts, step)
    except (OSError, pa.ArrowException):
        return None
    if not set(_COLUMNS) <= set(table.column_names):
        return None
    return table.select(_COLUMNS).to_pandas()


def sample_rows(arm: str, seed: int, lag: int, frame: pd.DataFrame) -> list[dict]:
    """The summary rows of one logged step of one trial (module docstring)."""
    rows = []
    keys = {"arm": arm, "lag": lag, "seeds": [seed]}
    prompts = sorted(frame[R.PROMPT_INDEX].unique())[:PROMPTS]
    for prompt in prompts:
        group = frame[frame[R.PROMPT_INDEX] == prompt]
        group = group[group[R.GROUP_ID] == group[R.GROUP_ID].iloc[0]]  # one draw of the prompt
        group = group.sort_values(R.SAMPLE_INDEX, kind="stable")
        step = int(group[R.STEP].iloc[0])
        at = f"step {step}, prompt {int(prompt)}"
        rewards = group[R.REWARD].astype(float)
        prompt_text = _cut(group[R.PROMPT_TEXT].iloc[0])
        rows.append(
            row(
                SECTION,
                "group_reward_mean",
                rewards.mean(),
                comparison=at,
                n=len(group),
                note=prompt_text,
                **keys,
            )
        )
        for sample in group.head(RESPONSES).itertuples(index=False):
            where = f"{at}, sample {int(getattr(sample, R.SAMPLE_INDEX))}"
            text = _cut(getattr(sample, R.RESPONSE_TEXT))
            value = float(getattr(sample, R.REWARD))
            rows.append(row(SECTION, "reward", value, comparison=where, note=text, **keys))
    return rows


def _shown_trials(
    trials: pd.DataFrame, root: Path | None
) -> list[tuple[str, int, int, TrialPaths]]:
    """(arm, seed, lag, paths) of the trial each arm shows: its first with a rollout log by
    (lag, seed, name)."""
    shown = []
    if root is None or not len(trials):
        return shown
    ordered = trials.sort_values(["arm", "lag", "seed", "trial_name"], kind="stable")
    for arm, cell in ordered.groupby("arm", sort=True):
        for trial in cell.itertuples(index=False):
            paths = TrialPaths(root / str(trial.trial_name))
            if logged_steps(paths):
                shown.append((str(arm), int(trial.seed), int(trial.lag), paths))
                break
    return shown


def analyse(inputs: Inputs, prior: pd.DataFrame) -> Part:
    """The rows of every arm's shown trial; none when no trial has a rollout log."""
    experiment = inputs.experiment
    rows: list[dict] = []
    for arm, seed, lag, paths in _shown_trials(experiment.trials, experiment.trials_root):
        steps = logged_steps(paths)
        for step in dict.fromkeys((steps[0], steps[-1])):  # one step when only one is logged
            frame = step_samples(paths, step)
            if frame is not None and len(frame):
                rows += sample_rows(arm, seed, lag, frame)
    return Part(rows)


def samples_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The section's rows as the reader sees them, in summary order: a prompt row (its text and
    its group's mean reward), then its responses (text, reward)."""
    part = summary[summary["section"] == SECTION]
    records = []
    for r in part.itertuples(index=False):
        reward = f"{r.value:.3g}"
        if r.statistic == "group_reward_mean":
            reward = f"{reward} (mean of {int(r.n)})"
        records.append(
            {
                "arm": str(r.arm),
                "at": str(r.comparison),
                "prompt / response": str(r.note),
                "reward": reward,
            }
        )
    return pd.DataFrame(records)


def blocks(page: Page) -> list[Block]:
    if not page.has(SECTION):
        return []
    part = page.summary[page.summary["section"] == SECTION]
    trials = part.drop_duplicates("arm")
    which = "; ".join(
        f"{r.arm}: seed {r.seeds[0]}, lag {r.lag}" for r in trials.itertuples(index=False)
    )
    text = (
        f"What each arm's policy wrote, from its trial's rollout log ({which}): at the first "
        f"and the last logged step, {PROMPTS} prompts (the lowest prompt indices) with their "
        f"group's mean reward, each followed by its first {RESPONSES} responses and their "
        f"rewards. Text as decoded by the trial's tokenizer (a response as the verifier read "
        f"it), shown literally: {NEWLINE_MARK} marks a line break, text past {MAX_CHARS} "
        "characters is cut (…). Every trained sample is in each trial's rollouts.parquet/."
    )
    return [
        Block("h2", "Sample completions"),
        Block("p", text),
        Block("table", table=samples_table(page.summary), literal=("prompt / response",)),
    ]
