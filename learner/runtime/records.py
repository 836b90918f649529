"""A trial's per-step records, as one object: metric rows (`metrics.parquet/`), eval rows
(`evals.parquet/`), the ledger of trained groups (`trained_groups/`) and the rollout log
(`rollouts.parquet/`: the trained samples of the logged steps).

The loop appends each step's rows (`append`, `eval_pass_rate`); a resume drops whatever is newer
than its checkpoint (`truncate_after`); a checkpoint of step k vouches for the files of steps
<= k with their sha256 in its manifest (`vouched`, the `records` of
`learner.runtime.checkpoint.CheckpointStore`), so a resumed learner fails in one line on a
missing or damaged one instead of completing with rows or groups silently missing. The file
formats are those of `metrics_log` (metrics, ledger), `evals_log` (evals) and
`contract.rollout_log` (rollouts, written here: `RolloutLog`).

The rollout log is built on the records writer thread from the step's trained groups
(`LoggedRollouts`, chosen on the training thread by `rollouts_to_log`: a hash per group), so
decoding and writing the text cost the training thread nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from buffer.rollout_group import RolloutGroup
from buffer.staleness import group_lag
from contract import rollout_log as R
from contract import step_tables
from contract.evals import EvalReport
from contract.layout import TrialPaths
from learner.config import RolloutLogConfig
from learner.runtime.evals_log import EvalsLog
from learner.runtime.metrics_log import GroupLedger, MetricsLog
from learner.runtime.task import TextDecoder


@dataclass(frozen=True)
class LoggedRollouts:
    """The groups of one step that go to the rollout log, and how to decode their tokens."""

    groups: tuple[RolloutGroup, ...]
    decode: TextDecoder | None = None


def rollouts_to_log(
    option: RolloutLogConfig,
    step: int,
    last_step: int,
    groups: Sequence[RolloutGroup],
    decode: TextDecoder | None,
) -> LoggedRollouts | None:
    """What of step `step`'s trained `groups` the rollout log keeps under `option` (None: the
    step is not logged). Cheap (a hash per group): it runs on the training thread."""
    if not R.is_logged_step(step, option.every, last_step):
        return None
    kept = tuple(g for g in groups if R.is_logged_group(g.group_id, option.share))
    return LoggedRollouts(kept, decode) if kept else None


def rollout_table(step: int, logged: LoggedRollouts) -> pa.Table:
    """Step `step`'s rows of the rollout log: one per sample of each logged group
    (`contract.rollout_log` says what each column means), with the per-token versions the
    group carries (`_token_versions`)."""
    columns: dict[str, list[object]] = {name: [] for name in R.ROLLOUT_LOG_SCHEMA.names}
    decode = logged.decode
    for group in logged.groups:
        prompt = group.prompt_ids.tolist()
        prompt_text = decode.prompt(prompt) if decode is not None else None
        versions = _token_versions(group)
        for index, response in enumerate(group.response_ids):
            ids = response.tolist()
            columns[R.STEP].append(step)
            columns[R.GROUP_ID].append(group.group_id)
            columns[R.PROMPT_INDEX].append(group.prompt_index)
            columns[R.SAMPLE_INDEX].append(index)
            columns[R.POLICY_VERSION].append(group.policy_version)
            columns[R.LAG].append(group_lag(step - 1, group.policy_version))
            columns[R.PROMPT_IDS].append(prompt)
            columns[R.RESPONSE_IDS].append(ids)
            columns[R.PROMPT_TEXT].append(prompt_text)
            columns[R.RESPONSE_TEXT].append(decode.response(ids) if decode is not None else None)
            columns[R.REWARD].append(group.rewards[index])
            columns[R.FINISH_REASON].append(group.finish_reasons[index])
            columns[R.BEHAVIOR_LOGPROBS].append(group.behavior_logprobs[index])
            columns[R.TOKEN_VERSIONS].append(versions[index])
    return R.rollout_table(columns)


def _token_versions(group: RolloutGroup) -> list[list[int]]:
    """Per sample, the version that sampled each response token: the record's own where it
    carries them (`versions_per_token`, rollout records v3: partial rollouts), else the group's
    `policy_version` on every token (records v1 and v2 were generated whole by one version)."""
    per_token = getattr(group, "versions_per_token", None)
    if per_token is not None:
        return [[int(v) for v in versions] for versions in per_token()]
    return [[group.policy_version] * len(ids) for ids in group.response_ids]


class RolloutLog:
    """The rollout log under `<trial_dir>/rollouts.parquet/`, one part per logged step."""

    def __init__(self, trial_dir: Path) -> None:
        self.root = TrialPaths(Path(trial_dir)).rollouts

    def append(self, step: int, logged: LoggedRollouts) -> None:
        """Write step `step`'s rows atomically (the directory is made by the first part)."""
        step_tables.write_part(self.root, step, rollout_table(step, logged))

    def steps(self) -> list[int]:
        return step_tables.part_steps(self.root)

    def truncate_after(self, step: int) -> None:
        """Drop the parts of steps > `step` (written by a run killed after its last checkpoint)."""
        step_tables.truncate_after(self.root, step)

    def read(self) -> pa.Table:
        """All rows so far, sorted by step (empty, with the schema, when nothing was logged);
        raises `contract.step_tables.DamagedPartError` if a part cannot be read."""
        table = step_tables.read_steps(self.root).table  # groups and samples in trained order
        return R.ROLLOUT_LOG_SCHEMA.empty_table() if table is None else table


class StepRecords:
    """Metric rows, eval rows, ledger and rollout log of one trial directory (module
    docstring)."""

    def __init__(self, trial_dir: Path) -> None:
        self.trial_dir = Path(trial_dir)
        self.metrics = MetricsLog(self.trial_dir)
        self.evals = EvalsLog(self.trial_dir)
        self.ledger = GroupLedger(self.trial_dir)
        self.rollouts = RolloutLog(self.trial_dir)

    def append(
        self,
        step: int,
        timestamp: float,
        metrics: dict[str, float],
        ledger: list[dict[str, object]] | None = None,
        rollouts: LoggedRollouts | None = None,
    ) -> None:
        """Write step `step`'s metric row, then its ledger rows (when it trained groups), then
        its rollout log rows (when the step is logged)."""
        self.metrics.append(step, timestamp, metrics)
        if ledger is not None:
            self.ledger.record(step, ledger)
        if rollouts is not None:
            self.rollouts.append(step, rollouts)

    def eval_pass_rate(self, step: int, result: EvalReport | float) -> float:
        """eval/pass_rate of the evals run after `step` updates.

        An EvalReport's rows (one per eval set) go to evals.parquet and its primary set's greedy
        rate is eval/pass_rate; a bare float is that rate alone, with no evals rows."""
        if isinstance(result, EvalReport):
            self.evals.append(step, result.scores)
            return result.pass_rate
        return float(result)

    def truncate_after(self, step: int) -> None:
        """Drop every record of steps > `step` (written by a run killed after its checkpoint)."""
        self.metrics.truncate_after(step)
        self.evals.truncate_after(step)
        self.ledger.truncate_after(step)
        self.rollouts.truncate_after(step)

    def vouched(self, through: int) -> dict[str, tuple[int, Path]]:
        """The per-step files a checkpoint of step `through` vouches for: the metric, eval and
        rollout parts and ledger files of steps <= `through`, as {path relative to the trial
        directory: (step, path)}."""
        found: dict[str, tuple[int, Path]] = {}
        for root in (self.metrics.root, self.evals.root, self.rollouts.root):
            for step in step_tables.part_steps(root):
                if step <= through:
                    part = step_tables.part_path(root, step)
                    found[f"{root.name}/{part.name}"] = (step, part)
        if self.ledger.root.is_dir():
            for step in self.ledger.steps():
                if step <= through:
                    path = self.ledger.path(step)
                    found[f"{self.ledger.root.name}/{path.name}"] = (step, path)
        return found
