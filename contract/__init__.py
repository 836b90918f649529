"""The trial contract: what harness, learner and analysis agree on about a trial.

- `contract.trial`: a trial's identity (`TrialSpec`), `StalenessMode`, `TrialStatus` (trial.json)
  and `LaunchStatus` (one `harness run` launch), with the terminal and resumable sets.
- `contract.layout`: the experiment and trial directory layout (`ExperimentPaths`, `TrialPaths`).
- `contract.record`: the validated `trial.json` record (`TrialRecord`) and its one reader.
- `contract.metrics`: the per-step metric names and the rule that combines each one.
- `contract.step_tables`: `metrics.parquet/`, `evals.parquet/` and `rollouts.parquet/`, one
  Parquet part per step: the one writer (atomic, truncation on resume) and reader (schema
  union, damaged parts reported).
- `contract.rollout_log`: the columns of `rollouts.parquet/` (the trained samples) and which
  steps and groups a trial logs.
- `contract.durable`: the one atomic write, fsync of a directory (or a tree) and file digest.
- `contract.checkpoint_manifest`: a checkpoint's `manifest.json` (its seal and its records).
- `contract.config_dump`: a config's resolved form, without the fields a table omits at their
  defaults (the rows: `learner.config.omitted`, `harness.config.OMITTED_AT_DEFAULT`).

This package imports nothing from harness, learner, analysis or buffer, so every other package
may depend on it and analysis depends on nothing else.
"""
