"""What a generator in a partial rollout asks between tokens: is there newer weights to load?

`staleness.partial_rollouts` (bounded mode): the torch generator's decode loop calls `newer`
every `staleness.partial_check_tokens` tokens; on an answer it loads that version in place and
continues the same responses under it (`TorchGenerator.generate`). The answer is the newest
published version the generator may use (`buffer.tickets.synced_version`: with
`staleness.sync_every` k, only multiples of k), read from the version registry: one Redis GET
per check, and the location only when there is something to load.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from buffer.tickets import synced_version
from buffer.versions import VersionRegistry
from harness.storage.remote_weights import WeightFetcher

# Tests only: every check first sleeps this long, so a tiny model's responses (a few tokens, a
# few milliseconds) outlast a learner step and new versions reliably arrive mid-response.
TEST_CHECK_DELAY_ENV = "HARNESS_TEST_PARTIAL_CHECK_DELAY_S"


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

    def newer(self, loaded: int) -> tuple[int, str] | None:
        if self.delay_s:
            time.sleep(self.delay_s)
        current = self.versions.current()
        if current is None:
            return None
        want = synced_version(current[0], self.sync_every)
        if want <= loaded:
            return None
        location = current[1] if want == current[0] else self.versions.location(want)
        if self.fetcher is not None:  # the announced path is on the learner's node
            location = self.fetcher.fetch(want)
        return want, location

    def switched(self, version: int, seconds: float) -> None:
        del version
        self.switches += 1
        self.switch_s += seconds
