"""How often the supervisor may restart a component: the trial's rule, not the launcher's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RestartBudget:
    """At most `limit` restarts of one component in a row without progress of the trial.

    Progress is a count the caller supplies that never decreases (the supervisor passes learner
    steps plus tickets completed, i.e. groups pushed by any generator). A crash after progress
    since the last restart starts a fresh budget, so a long trial survives any number of isolated
    crashes, while a component that dies again and again at the same point still fails the trial
    after `limit` restarts instead of looping forever.
    """

    limit: int
    used: int = 0
    mark: int | None = None  # the highest progress seen at a granted restart

    def spend(self, progress: int) -> bool:
        """Record a crash seen at `progress`; True when a restart is granted (and counted).

        Only a progress above the mark renews the budget: a lower reading (a count the caller
        could not read in full) must not, or a flapping reading would restart forever.
        """
        if self.mark is not None and progress > self.mark:
            self.used = 0
        if self.used >= self.limit:
            return False
        self.used += 1
        self.mark = progress if self.mark is None else max(self.mark, progress)
        return True
