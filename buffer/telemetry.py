"""Run counters and generator telemetry, stored in Redis so the learner can log all of them.

Generators write their own figures (tokens/s, idle fraction, weight-sync seconds: the `perf/*`
names of contract.metrics) into one hash each; the learner reads every generator's hash plus the
buffer's counters at each step. Values are parsed with float(); nothing is evaluated.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import redis

from buffer.connection import RunKeys
from contract import metrics as m

# Fields of the run's counters hash (RunKeys.counters).
DEAD_LETTER = "dead_letter"
DROPPED_STALE = "dropped_stale"
LOST_TO_REWIND = "lost_to_rewind"  # groups made from weights a bounded-mode rewind withdrew
DUPLICATE = "duplicate"  # a group id pushed again with the same contents, or already trained
# A group id pushed again with other contents: dead-lettered (also counted in dead_letter).
CONFLICTING_DUPLICATE = "conflicting_duplicate"

UPDATED_AT = "updated_at"  # unix seconds of a generator's last report (a liveness hint)


class Telemetry:
    """Write one generator's figures; read everyone's plus the buffer's counters."""

    def __init__(self, client: redis.Redis, run_id: str):
        self._client = client
        self._keys = RunKeys(run_id)

    def report(self, generator_id: str, figures: Mapping[str, float]) -> None:
        """Overwrite a generator's figures, keyed by metric_names (e.g. PERF_GEN_TOKENS_PER_S)."""
        values = {name: repr(float(value)) for name, value in figures.items()}
        values[UPDATED_AT] = repr(time.time())
        pipe = self._client.pipeline(transaction=True)
        pipe.sadd(self._keys.generators, generator_id)
        pipe.hset(self._keys.telemetry(generator_id), mapping=values)
        pipe.execute()

    def generators(self) -> dict[str, dict[str, float]]:
        """Every reporting generator's figures, keyed by generator id."""
        ids = sorted(g.decode() for g in self._client.smembers(self._keys.generators))
        pipe = self._client.pipeline(transaction=False)
        for generator_id in ids:
            pipe.hgetall(self._keys.telemetry(generator_id))
        return {
            generator_id: {k.decode(): float(v) for k, v in raw.items()}
            for generator_id, raw in zip(ids, pipe.execute(), strict=True)
        }

    def generator_metrics(self) -> dict[str, float]:
        """Fleet-wide perf/* figures, each combined over generators by its contract.metrics rule
        (tokens/s summed; idle fraction, weight-sync time and CPU share averaged).

        Only generators that reported a figure count toward it; none reported: absent.
        """
        figures = list(self.generators().values())
        out: dict[str, float] = {}
        combined = (
            m.PERF_GEN_TOKENS_PER_S,
            m.PERF_GEN_IDLE_FRAC,
            m.PERF_WEIGHT_SYNC_S,
            m.PERF_GEN_CPU_FRAC,
        )
        for name in combined:
            values = [f[name] for f in figures if name in f]
            if values:
                out[name] = m.combine(name, values)
        return out

    def buffer_metrics(self) -> dict[str, float]:
        """buffer/depth, buffer/dropped_stale and buffer/dead_letter, for the learner's step log."""
        pipe = self._client.pipeline(transaction=False)
        pipe.xlen(self._keys.stream)
        pipe.hmget(self._keys.counters, [DROPPED_STALE, DEAD_LETTER])
        depth, (dropped, dead) = pipe.execute()
        return {
            m.BUFFER_DEPTH: float(depth),
            m.BUFFER_DROPPED_STALE: float(dropped or 0),
            m.BUFFER_DEAD_LETTER: float(dead or 0),
        }
