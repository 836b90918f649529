"""A run's timeline of policy versions: which published versions a bounded-mode rewind withdrew.

Why. Version v is "the weights after v learner steps". A bounded-mode learner that resumes from
the checkpoint of step c while the registry is at v > c (killed between two checkpoints, or
fallen back past a damaged checkpoint or step file) trains steps c+1, c+2, ... again, and not
bitwise: the weights it publishes under those numbers are not the ones a generator may already
hold under them. Its resume therefore *withdraws* the versions after c (`buffer.rewind.
rewind_bounded`): the registry moves back to c and the rewind is appended to the run's `rewinds`
list. The list's length is the run's timeline number; a generator tags each round's groups with
the number it read before it loaded the weights they were made from, and the learner drops a
group made from withdrawn weights (counted, its ticket reissued) instead of training it or
dead-lettering it as "newer than the learner".

Rewind i (0-based) moves the timeline from i to i + 1 back to version c_i (its list entry is
"c_i:v_i", v_i the version it moved back from). Weights of version v
loaded while the timeline was t are withdrawn iff a later rewind went below v: min(c_j, j >= t)
< v. Fixed mode never rewinds the timeline: its replays are bitwise, so a republished version is
the same weights (`learner.runtime.published.PublishedWeights._check_replay`).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from buffer.connection import RunKeys


@dataclass(frozen=True)
class Timeline:
    """The rewinds of one run so far: `rewinds[i]` is the version rewind i went back to."""

    rewinds: tuple[int, ...] = ()
    withdrawn_from: tuple[int, ...] = ()  # the registry's version each rewind moved back from

    @property
    def number(self) -> int:
        """How many rewinds the run has had: what a generator tags its groups with."""
        return len(self.rewinds)

    def withdrawn(self, version: int, loaded_at: int) -> bool:
        """Whether weights of `version`, loaded while the timeline number was `loaded_at`, were
        withdrawn by a later rewind (a rewind to below `version`)."""
        later = self.rewinds[max(loaded_at, 0) :]
        return bool(later) and version > min(later)

    def versions_withdrawn(self, since: int) -> int:
        """How many published versions the rewinds after timeline number `since` withdrew."""
        pairs = zip(self.rewinds[since:], self.withdrawn_from[since:], strict=True)
        return sum(moved_from - to for to, moved_from in pairs)


def read_timeline(client: redis.Redis, run_id: str) -> Timeline:
    """The run's timeline (one LRANGE; an empty list, the common case, is a few bytes)."""
    entries = [raw.decode().split(":") for raw in client.lrange(RunKeys(run_id).rewinds, 0, -1)]
    return Timeline(tuple(int(e[0]) for e in entries), tuple(int(e[-1]) for e in entries))
