"""What a generator in a partial rollout asks between tokens: is there newer weights to load?

`staleness.partial_rollouts` (bounded mode): the torch generator's decode loop calls `newer`
every `staleness.partial_check_tokens` tokens; on an answer it loads that version in place and
continues the same responses under it (`TorchGenerator.generate`). The answer is the newest
published version the generator may use (`buffer.tickets.synced_version`: with
`staleness.sync_every` k, only multiples of k). A check costs no round trip: the version comes
from the registry's announcements (`buffer.versions.VersionAnnouncements`, a subscription read
without blocking), and the registry itself is read at the first check and then at least every
`REREAD_S` seconds, should an announcement be lost (pub/sub delivers at most once); the
location is read only when there is something to load. (Polling the registry at every check,
two round trips, cost 25-30% of the torch generator's tokens/s at one check a token.)
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

from buffer.tickets import synced_version
from buffer.versions import VersionAnnouncements, VersionRegistry
from harness.storage.remote_weights import WeightFetcher

# Tests only: every check first sleeps this long, so a tiny model's responses (a few tokens, a
# few milliseconds) outlast a learner step and new versions reliably arrive mid-response.
TEST_CHECK_DELAY_ENV = "HARNESS_TEST_PARTIAL_CHECK_DELAY_S"
# How stale the newest version a generator knows may get should announcements be lost: a learner
# step takes longer on every model worth a partial rollout, so a lost one delays a switch by at
# most about one step.
REREAD_S = 1.0


@dataclass
class PublishedUpdates:
    """`harness.generators.base.WeightUpdates` over a run's version registry."""

    versions: VersionRegistry
    sync_every: int
    check_tokens: int
    fetcher: WeightFetcher | None = None  # the Ray executor's copy of a bucket's weights
    switches: int = 0  # versions loaded mid-generation
    switch_s: float = 0.0  # seconds spent loading them
    delay_s: float = field(default_factory=lambda: float(os.environ.get(TEST_CHECK_DELAY_ENV, "0")))
    reread_s: float = REREAD_S
    _announced: VersionAnnouncements | None = field(default=None, repr=False)
    _newest: int | None = None  # the newest version known published
    _read_at: float = -math.inf  # when the registry itself was last read

    def newer(self, loaded: int) -> tuple[int, str] | None:
        if self.delay_s:
            time.sleep(self.delay_s)
        newest = self._newest_published()
        if newest is None:
            return None
        want = synced_version(newest, self.sync_every)
        if want <= loaded:
            return None
        try:
            location = self.versions.location(want)
        except KeyError:  # withdrawn by a rewind (`buffer.timeline`) since it was announced
            self.rewound()
            return None
        if self.fetcher is not None:  # the announced path is on the learner's node
            location = self.fetcher.fetch(want)
        return want, location

    def _newest_published(self) -> int | None:
        """The newest published version: announcements since the last check, and the registry
        itself at the first check and every `reread_s` seconds after."""
        if self._announced is None:
            self._announced = self.versions.announcements()  # before the first read
        announced = self._announced.newest()
        if announced is not None:
            self._newest = max(announced, self._newest if self._newest is not None else -1)
        now = time.monotonic()
        if now - self._read_at >= self.reread_s:
            self._read_at = now
            read = self.versions.latest()
            if read is not None:
                self._newest = max(read, self._newest if self._newest is not None else -1)
        return self._newest

    def rewound(self) -> None:
        """A rewind moved the registry back: forget the newest version known (it may be a
        withdrawn one) and read the registry itself at the next check."""
        self._newest, self._read_at = None, -math.inf

    def close(self) -> None:
        """End the subscription (a warm generator process outlives its trials)."""
        if self._announced is not None:
            self._announced.close()
            self._announced = None

    def switched(self, version: int, seconds: float) -> None:
        del version
        self.switches += 1
        self.switch_s += seconds
