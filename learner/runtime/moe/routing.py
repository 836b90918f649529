"""The `Routing` of an MoE policy: pi_old's experts captured (or the generator's replayed) at
the start of a step, replayed in its gradient forwards, and counted against after the updates.

`MoeRouting` is the one object per learner (`learner.runtime.moe.setup.setup_routing` chooses it
for a policy with supported routers); each step's state, pi_old's routing record and the parts
its passes run in, is a `StepRouting` that `capture_old` makes and `metrics` lets go.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch import Tensor, nn

from learner.runtime.moe.base import LogProbs, PartContext, RoutedBatch
from learner.runtime.moe.hooks import RoutingRecord, capture_routing, replay_experts, router_modules
from learner.runtime.moe.logratio import LogRatioTally
from learner.runtime.moe.metrics import predicting_positions
from learner.runtime.moe.record import PartCaptures, cut, is_whole, part_width
from learner.runtime.moe.tally import RoutingTally
from learner.runtime.update import MicroBatch, take
from learner.vocabulary import RoutingReplay


class MoeRouting:
    """The `Routing` (`learner.runtime.moe.base`) of an MoE policy, for the arm's
    `routing_replay` (`replay`): one per learner, a `StepRouting` per step. `capture_old` makes
    the step's and `metrics` lets it go, so pi_old's host record of a batch lives from the
    step's start to its `moe/*` metrics, as long as the step needs it and no longer."""

    def __init__(self, policy: nn.Module, replay: RoutingReplay) -> None:
        self.policy, self.mode = policy, replay
        self.step: StepRouting | None = None

    def capture_old(
        self, batch: RoutedBatch, parts: list[MicroBatch]
    ) -> AbstractContextManager[PartContext]:
        self.step = None  # the previous step's record goes before this one's is made
        self.step = StepRouting(
            self.policy, self.mode, batch.input_ids, batch.attention_mask, batch.routed_experts
        )
        return self.step.capture_old(parts)

    def replay(self, rows: Tensor, width: int | None = None) -> AbstractContextManager[None]:
        return self._current("replay").replay(rows, width)

    def metrics(
        self, mask: Tensor, logprobs: LogProbs | None = None, old_lp: Tensor | None = None
    ) -> dict[str, float]:
        step, self.step = self._current("metrics"), None
        return step.metrics(mask, logprobs, old_lp)

    def _current(self, what: str) -> StepRouting:
        if self.step is None:
            raise RuntimeError(f"MoeRouting.{what} outside a step: call capture_old first")
        return self.step


class StepRouting:
    """The MoE routing of one learner step, on an MoE policy (`MoeRouting` makes one a step).

    1. `capture_old(parts)` wraps the start-of-step pass (pi_old under `old_logprobs:
       recompute`) in the step's micro-batches (`learner.micro_batch_tokens`, the parts of
       `step._score`): it yields the context each part's forward runs in, captures that part's
       routing, and on exit keeps the learner's own routing of the whole batch (`old`), put back
       in place (layers, B, L, k) in host memory (`learner.runtime.moe.record`). So the pass
       holds one micro-batch's forward and capture at a time on the device, as a dense one
       holds its forward; the batch's record (experts and per-token router entropy, never the
       router logits) waits on the host;
    2. `replay(rows, width)` wraps a minibatch (or micro-batch, cut to `width` positions)
       forward: `routing_replay: old` replays `old`'s experts of those rows (that slice moved
       to the device), `rollout` the generator's (`rollout`, from `RolloutBatch.routed_experts`);
    3. `metrics(mask)` runs one extra no-grad pass of the updated policy, in the same parts
       (the same on every rank, so FSDP's per-forward gathers match), counts each part's
       routing against the same rows of `old` (`RoutingTally`) and returns `moe/*` over the
       positions that score response tokens (`predicting_positions`). Given `logprobs` and
       pi_old's log-probs, that pass scores the part's tokens and a second one scores them on
       pi_old's experts (`learner.runtime.moe.logratio`: routing's share of the log-ratio's
       variance, over the response tokens); each part's logits are freed as its log-probs exist.

    With `rollout` each part's start-of-step forward replays the generator's experts of its rows
    (pi_old on the sampler's sub-network), and `old` comes from one extra no-grad pass without
    replay, so `moe/routing_change_frac` compares the learner's own routing before and after the
    updates in every mode, and `moe/rollout_routing_mismatch` (whenever the batch carries
    routing) the learner's own start-of-step routing with the generator's. With `old` and
    `old_logprobs: behavior` the replayed experts are those of the learner's start-of-step
    weights, not the sampler's (at lag 0 the same weights; `rollout` replays the sampler's).

    A part computes its rows up to its width, its longest row; positions beyond are padding, and
    `old` holds a harmless fill there (`blank_routing`). At a real position a part's routing is
    the whole batch's up to float rounding of the router's inputs: a causal forward's output at
    p depends on the row's positions up to p only, and padding is masked out of attention.
    """

    def __init__(
        self,
        policy: nn.Module,
        replay: RoutingReplay,
        input_ids: Tensor,
        attention_mask: Tensor,
        rollout: Tensor | None = None,
    ) -> None:
        self.policy = policy
        self.mode = replay
        self.input_ids, self.attention_mask = input_ids, attention_mask  # the step's batch
        self.batch, self.length = int(input_ids.shape[0]), int(input_ids.shape[1])
        if replay == "rollout" and rollout is None:
            raise ValueError(
                "routing_replay: rollout replays the experts the generator routed each token "
                "to, but this batch carries none: at least one of its groups has no "
                "routed_experts (only the torch generator records them, for an MoE policy; "
                "vLLM generators and schema-v1 records do not). Use generation.backend: torch, "
                "or routing_replay: old"
            )
        self.rollout = rollout
        if self.rollout is not None:
            _check_rollout(self.rollout, router_modules(policy), (self.batch, self.length))
        self.old: RoutingRecord | None = None
        self.parts: list[MicroBatch] = []  # the step's no-grad micro-batches, from capture_old

    @contextmanager
    def capture_old(self, parts: list[MicroBatch]) -> Iterator[PartContext]:
        """Yields `around`: enter `around(part)` around each part's pi_old forward (of
        `take(input_ids, part)`); `old` is the batch's routing once the context exits."""
        self.parts = parts
        if self.mode == "rollout":
            yield self._replay_rollout  # pi_old: the learner's weights on the generator's experts
            self.old = self._own_routing()  # the learner's own routing of the batch, no replay
            return
        captures = PartCaptures(self.policy, parts, self.batch, self.length)
        yield captures.around
        self.old = captures.routing()

    def _replay_rollout(self, part: MicroBatch) -> AbstractContextManager[None]:
        assert self.rollout is not None  # checked in __init__
        whole = is_whole(self.parts)  # then no copy of the batch's routed experts
        experts = self.rollout if whole else self.rollout[:, part.rows, : part.width]
        return replay_experts(self.policy, experts)

    def _route(self, part: MicroBatch) -> None:
        """A no-grad forward of the part's rows for its routers' sake: `logits_to_keep=1` has
        the causal LM project only the last position, so no [tokens, vocabulary] logits."""
        ids, attn = self.input_ids, self.attention_mask
        whole = is_whole(self.parts)
        self.policy(
            input_ids=ids if whole else take(ids, part),
            attention_mask=attn if whole else take(attn, part),
            use_cache=False,
            logits_to_keep=1,
        )

    @torch.no_grad()
    def _own_routing(self) -> RoutingRecord:
        """The policy's own routing of the step's batch (a record on the host), from no-grad
        forwards without replay, one per micro-batch of `capture_old`'s parts."""
        captures = PartCaptures(self.policy, self.parts, self.batch, self.length)
        for part in self.parts:
            with captures.around(part):
                self._route(part)
        return captures.routing()

    @torch.no_grad()
    def _own_experts(self, part: MicroBatch) -> Tensor:
        """The policy's own experts of one part's rows (layers, b, width, k), on the device."""
        with capture_routing(self.policy) as recorder:
            self._route(part)
        return recorder.indices(int(part.rows.numel()), part_width(part, self.length))

    def replay(self, rows: Tensor, width: int | None = None) -> AbstractContextManager[None]:
        if self.mode == "off":
            return contextlib.nullcontext()
        if self.mode == "rollout":
            assert self.rollout is not None  # checked in __init__
            return replay_experts(self.policy, self.rollout[:, rows, :width])
        if self.old is None:
            raise RuntimeError("StepRouting.replay before capture_old: pi_old's routing is unset")
        experts = cut(self.old.indices, rows, width).to(self.input_ids.device)  # (layers,b,w,k)
        return replay_experts(self.policy, experts)

    def _replay_pi_old(self, part: MicroBatch) -> AbstractContextManager[None]:
        """The experts pi_old's log-probs of the part were computed on: the generator's under
        `rollout` (as its pi_old pass replayed them), else the learner's own start-of-step
        routing (what `routing_replay: old` replays), in every mode."""
        if self.mode == "rollout":
            return self._replay_rollout(part)
        assert self.old is not None  # checked in metrics
        experts = cut(self.old.indices, part.rows, part.width).to(self.input_ids.device)
        return replay_experts(self.policy, experts)

    @torch.no_grad()
    def _log_ratios(
        self,
        part: MicroBatch,
        logprobs: LogProbs,
        old_lp: Tensor,
        mask: Tensor,
        tally: LogRatioTally,
    ) -> Tensor:
        """Score the part's rows with the routers free (capturing their experts, returned
        (layers, b, width, k) on the device) and on pi_old's experts; add both log-ratios
        against `old_lp` over the part's response tokens to `tally`."""
        whole = is_whole(self.parts)  # then the batch itself, as the pi_old pass read it
        ids, attn = self.input_ids, self.attention_mask
        ids, attn = (ids, attn) if whole else (take(ids, part), take(attn, part))
        old_lp, mask = (old_lp, mask) if whole else (take(old_lp, part), take(mask, part))
        with capture_routing(self.policy) as recorder:
            free = logprobs(ids, attn)  # (b, width)
        experts = recorder.indices(int(part.rows.numel()), part_width(part, self.length))
        del recorder  # its per-layer captures: only the stacked experts are left
        with self._replay_pi_old(part):
            replayed = logprobs(ids, attn)  # (b, width)
        tally.add(free - old_lp, replayed - old_lp, mask)
        return experts

    @torch.no_grad()
    def metrics(
        self, mask: Tensor, logprobs: LogProbs | None = None, old_lp: Tensor | None = None
    ) -> dict[str, float]:
        """`moe/*` after the updates; with `logprobs` and `old_lp` (pi_old's log-probs [B, L],
        from the step's start) also `LOGRATIO_METRICS`, the routing pass then scoring tokens."""
        if self.old is None:
            raise RuntimeError("StepRouting.metrics before capture_old: pi_old's routing is unset")
        scored = predicting_positions(mask).float()  # (B, L)
        tally = RoutingTally(self.old, scored, self.rollout is not None)
        ratios = None if logprobs is None or old_lp is None else LogRatioTally(mask.device)
        for part in self.parts:
            rollout = None if self.rollout is None else cut(self.rollout, part.rows, part.width)
            if ratios is None:
                experts = self._own_experts(part)  # routing only: no logits
            else:
                assert logprobs is not None and old_lp is not None
                experts = self._log_ratios(part, logprobs, old_lp, mask, ratios)
            tally.add(part.rows, part.width, experts, rollout)
        return tally.metrics() | ({} if ratios is None else ratios.metrics())


def _check_rollout(rollout: Tensor, routers: list[nn.Module], shape: tuple[int, int]) -> None:
    """The generator's routing must fit this policy and batch, or replay would misroute."""
    layers, top_k = len(routers), int(routers[0].top_k)
    experts = int(routers[0].weight.shape[0])
    want = (layers, *shape, top_k)
    if tuple(rollout.shape) != want:
        raise ValueError(
            f"the batch's routed_experts have shape {tuple(rollout.shape)}, the policy and "
            f"batch need (layers, B, L, top_k) = {want}; the generator served another model"
        )
    if rollout.numel() and not 0 <= int(rollout.min()) <= int(rollout.max()) < experts:
        raise ValueError(
            f"the batch's routed_experts hold experts {int(rollout.min())}..{int(rollout.max())}"
            f", outside this policy's 0..{experts - 1}; the generator served another model"
        )
