"""The experiment tier: the trial grid, scheduling, progress display and MLflow tracking."""
