"""The trial contract: what harness, learner and analysis agree on about a trial.

A trial's identity, its directory layout, its statuses and modes, its `trial.json` record and the
per-step metric schema. This package imports nothing from harness, learner, analysis or buffer, so
every other package may depend on it and analysis depends on nothing else.
"""
