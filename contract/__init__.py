"""The trial contract: what harness, learner and analysis agree on about a trial.

- `contract.trial`: a trial's identity (`TrialSpec`), `StalenessMode`, `TrialStatus` (trial.json)
  and `LaunchStatus` (one `harness run` launch), with the terminal and resumable sets.
- `contract.layout`: the experiment and trial directory layout (`ExperimentPaths`, `TrialPaths`).
- `contract.record`: the validated `trial.json` record (`TrialRecord`) and its one reader.
- `contract.metrics`: the per-step metric names and the rule that combines each one.

This package imports nothing from harness, learner, analysis or buffer, so every other package
may depend on it and analysis depends on nothing else.
"""
