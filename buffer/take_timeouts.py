"""Why a take gave up: the one-line TimeoutError each kind of take raises, naming what it had and
the likeliest cause. Pure functions of what the consumer saw, so the wording is tested alone."""

from __future__ import annotations


def batch_timeout(
    run_id: str,
    batch_index: int,
    n_groups: int,
    timeout_s: float,
    *,
    have: int,
    stashed: int,
    max_depth: int,
) -> TimeoutError:
    """Fixed mode: batch `batch_index` had `have` of `n_groups` groups; `stashed` groups of
    later batches wait in the stash (at `max_depth` the stash itself is what blocks)."""
    hint = "are generators running and has the version they wait for been published?"
    if stashed >= max_depth:
        hint = (
            f"the stash holds {stashed} groups of later batches = buffer.max_depth; raise "
            "max_depth to at least (lag + 1) * prompts_per_step"
        )
    return TimeoutError(
        f"run {run_id!r}: batch {batch_index} has {have} of {n_groups} groups after "
        f"{timeout_s} s; {hint}"
    )


def take_timeout(
    run_id: str,
    n_groups: int,
    timeout_s: float,
    *,
    have: int,
    max_lag: int,
    learner_version: int,
) -> TimeoutError:
    """Bounded mode: only `have` of `n_groups` groups within the lag bound arrived."""
    return TimeoutError(
        f"run {run_id!r}: only {have} of {n_groups} groups with lag <= {max_lag} "
        f"arrived within {timeout_s} s (learner version {learner_version}); are generators "
        "running and admitted?"
    )
