"""A trial's per-step records, as one object: metric rows (`metrics.parquet/`), eval rows
(`evals.parquet/`) and the ledger of trained groups (`trained_groups/`).

The loop appends each step's rows (`append`, `eval_pass_rate`); a resume drops whatever is newer
than its checkpoint (`truncate_after`); a checkpoint of step k vouches for the files of steps
<= k with their sha256 in its manifest (`vouched`, the `records` of
`learner.runtime.checkpoint.CheckpointStore`), so a resumed learner fails in one line on a
missing or damaged one instead of completing with rows or groups silently missing. The file
formats are those of `metrics_log` (metrics, ledger) and `evals_log` (evals).
"""

from __future__ import annotations

from pathlib import Path

from contract import step_tables
from contract.evals import EvalReport
from learner.runtime.evals_log import EvalsLog
from learner.runtime.metrics_log import GroupLedger, MetricsLog


class StepRecords:
    """Metric rows, eval rows and ledger of one trial directory (module docstring)."""

    def __init__(self, trial_dir: Path) -> None:
        self.trial_dir = Path(trial_dir)
        self.metrics = MetricsLog(self.trial_dir)
        self.evals = EvalsLog(self.trial_dir)
        self.ledger = GroupLedger(self.trial_dir)

    def append(
        self,
        step: int,
        timestamp: float,
        metrics: dict[str, float],
        ledger: list[dict[str, object]] | None = None,
    ) -> None:
        """Write step `step`'s metric row, then its ledger rows (when it trained groups)."""
        self.metrics.append(step, timestamp, metrics)
        if ledger is not None:
            self.ledger.record(step, ledger)

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

    def vouched(self, through: int) -> dict[str, tuple[int, Path]]:
        """The per-step files a checkpoint of step `through` vouches for: the metric and eval
        parts and ledger files of steps <= `through`, as {path relative to the trial directory:
        (step, path)}."""
        found: dict[str, tuple[int, Path]] = {}
        for root in (self.metrics.root, self.evals.root):
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
