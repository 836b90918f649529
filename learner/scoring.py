"""What the generators take from the learner: its scoring pass and its routing capture.

A generator must agree with the learner in two places, so it uses the learner's own code rather
than a copy of it: the log-probs it checks its behaviour log-probs against are the learner's
(`policy_logprobs` inside `scoring`, `harness.generators.sampling`), and the experts it records
for R3 routing replay are captured by the hooks the learner replays them with
(`capture_routing`, `router_modules`, `harness.generators.torch_backend`). This module is that
surface, and the only part of the learner a generator imports besides the pure
`learner.algorithms`: `learner.runtime` may move its modules without touching `harness`
(`tests/contract/test_dependencies.py` holds the generators to it).
"""

from __future__ import annotations

from learner.runtime.forward import policy_logprobs, scoring
from learner.runtime.moe.hooks import capture_routing, router_modules

__all__ = ["capture_routing", "policy_logprobs", "router_modules", "scoring"]
