"""The trial tier: one (arm, seed, lag, mode) run, its supervisor and its component processes."""
