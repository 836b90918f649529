"""What a launch of `harness run` asks for, as one value both stages of a tuned run share.

`run_experiment` and `run_tuned_experiment` take the same six inputs (the resolved config, the
path and overrides each trial subprocess is started from, where the output goes, how many trials
run at once, an optional step count); a tuned run hands them on to each stage with its own
config, path and directory. One frozen value keeps the two signatures from drifting apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.config import ExperimentConfig


@dataclass(frozen=True)
class ExperimentRequest:
    """`cfg` is the resolved config (`config_path` with `overrides` applied); the same path
    and overrides are handed to each `harness trial` subprocess. `out_dir` defaults to
    `<output_dir>/<name>`, `max_parallel` to `cfg.max_parallel`; `steps` overrides
    learner.steps."""

    cfg: ExperimentConfig
    config_path: Path
    out_dir: Path | str | None = None
    overrides: Sequence[str] = ()
    max_parallel: int | None = None
    steps: int | None = None

    def stage(self, cfg: ExperimentConfig, config_path: Path, out_dir: Path) -> ExperimentRequest:
        """One stage of a tuned run: its derived config, written to `config_path` with the
        launch's overrides already applied, run in `out_dir`."""
        return dataclasses.replace(
            self, cfg=cfg, config_path=config_path, out_dir=out_dir, overrides=()
        )
