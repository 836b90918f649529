"""The trial contract: what harness, learner and analysis agree on about a trial.

- `contract.trial`: a trial's identity (`TrialSpec`), `StalenessMode`, `TrialStatus` (trial.json)
  and `LaunchStatus` (one `harness run` launch), with the terminal and resumable sets.
- `contract.layout`: the experiment and trial directory layout (`ExperimentPaths`, `TrialPaths`).
- `contract.record`: the validated `trial.json` record (`TrialRecord`) and its one reader.
- `contract.metrics`: the per-step metric names and the rule that combines each one.
- `contract.step_tables`: `metrics.parquet/` and `evals.parquet/`, one Parquet part per step: the
  one writer (atomic, truncation on resume) and reader (schema union, damaged parts reported).

This package imports nothing from harness, learner, analysis or buffer, so every other package
may depend on it and analysis depends on nothing else.
"""
