"""The one place a learner chooses its policy's `Routing`: MoE or dense, once, at build time.

`learner.runtime.models.build_step_models` calls `setup_routing` when it builds the policy, so
every step of a dense policy runs through `NoRouting` and never asks whether the policy is an
MoE; an arm that asks for routing replay on a policy without supported routers fails there,
before the first step.
"""

from __future__ import annotations

from torch import nn

from learner.runtime.moe.base import NO_ROUTING, Routing
from learner.runtime.moe.hooks import ROUTER_TYPES, is_moe
from learner.runtime.moe.routing import MoeRouting
from learner.vocabulary import RoutingReplay


def setup_routing(policy: nn.Module, replay: RoutingReplay) -> Routing:
    """`MoeRouting` for a policy with supported routers (`ROUTER_TYPES`), `NO_ROUTING` for
    one without; `replay` is the arm's `routing_replay`, which a dense policy cannot honour."""
    if is_moe(policy):
        return MoeRouting(policy, replay)
    if replay != "off":
        raise ValueError(
            f"routing_replay: {replay} needs an MoE policy with a supported router "
            f"({', '.join(t.__name__ for t in ROUTER_TYPES)}); this policy has none. Set "
            "model.arch: qwen3_moe, or routing_replay: off"
        )
    return NO_ROUTING
