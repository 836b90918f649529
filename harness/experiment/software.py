"""The one-line warnings of a launch whose trials were made under other software (another lock
or other package versions, `contract.environment`): trials on disk against this launch, and a
tuned experiment's tuning trials against its final ones."""

from __future__ import annotations

import contextlib
from pathlib import Path

from contract.environment import mixed_line
from contract.layout import ExperimentPaths
from contract.record import TrialRecordError, read_trial_record
from harness.experiment.grid import TrialOnDisk
from harness.provenance import provenance


def launch_software_line(trials: list[TrialOnDisk]) -> str | None:
    """One line when trials on disk (finished, or to be resumed) were made under another lock
    or other package versions than this launch has; None when they agree or none exist."""
    earlier = {
        trial.spec.trial_name: trial.record.provenance
        for trial in trials
        if trial.record is not None and trial.record.provenance
    }
    if not earlier:
        return None  # nothing on disk: this launch's provenance is not even read
    launch = {"this launch": provenance()}
    return mixed_line({**earlier, **launch}, "the trials on disk and this launch")


def stages_software_line(root: Path, tuning_dir: Path) -> str | None:
    """One line when the tuning trials (which made the selection) and the final trials (which
    compare the selected arms) were made under different locks or package versions."""
    provenances = {}
    for stage, directory in (("tuning", tuning_dir), ("final", root)):
        trials = ExperimentPaths(directory).trials
        for trial_dir in sorted(trials.iterdir()) if trials.is_dir() else []:
            with contextlib.suppress(OSError, TrialRecordError):
                record = read_trial_record(trial_dir)
                if record is not None:
                    provenances[f"{stage}/{trial_dir.name}"] = record.provenance
    return mixed_line(provenances, "the tuning and final trials")
