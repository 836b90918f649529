"""The buffer's public interface: import what a generator or a learner needs from here.

Generator worker::

    with connect(cfg.buffer.redis_url, cfg.buffer.tls_ca_file) as client:
        producer = RolloutProducer(client, run_id, cfg.buffer)  # creates no consumer group
        tickets = TicketDispenser(client, run_id)
        versions = VersionRegistry(client, run_id)
        while not producer.stop_requested():
            version, location = versions.current()          # after the learner published v0
            ticket = tickets.claim(generator_id, admission_limit(version, lag, prompts_per_step))
            if ticket is None: versions.wait_for_version(version + 1, timeout_s); continue
            batch = ticket_batch(ticket, prompts_per_step)
            # fixed mode: weights of exactly fixed_policy_version(batch, lag); bounded: latest
            producer.push(group, batch, ticket=ticket)           # completes the ticket

Learner loop::

    buffer = RolloutConsumer(client, run_id, cfg.buffer)     # creates the consumer group
    deliveries = buffer.take_batch(step, prompts_per_step, consumer, timeout_s,      # fixed
                                   rules=rules, slots=trial_slots)
    deliveries = buffer.take(prompts_per_step, step, max_lag, consumer, timeout_s,
                             rules=rules).deliveries                                 # bounded
    # rules: what a group must be to be trained (buffer.intake.IntakeRules, data): a refused
    # group goes to the dead letter before it can take a slot or count as seen
    batch = collate([d.group for d in deliveries], pad_id)     # buffer.collate
    ... train ...
    versions.publish(step + 1, weights.write(step + 1, model))    # generators may use it now
    ... at the next checkpoint (which records the trained group ids) ...
    buffer.commit(deliveries)          # marks the groups trained and acks them in one MULTI

Run control (supervisor, watcher): `request_stop(client, run_id)`, `stop_requested`, `clear_stop`
and `delete_run(client, run_id)`, plain functions of `buffer.run_control`.

The learner types against the protocols at the end of this module (RolloutSource, WeightWriter,
VersionPublisher, TelemetryReader): a handful of methods each, satisfied by the classes here.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from buffer.connection import BufferConnectionError, RunKeys, connect, redact
from buffer.consumer import RolloutConsumer, SlotRefusedError, TakeResult
from buffer.inbox import Delivery
from buffer.intake import Check, IntakeRules
from buffer.outbox import BufferFullError
from buffer.producer import RolloutProducer
from buffer.record_types import RecordError
from buffer.rollout_group import RolloutGroup
from buffer.run_control import clear_stop, delete_run, request_stop, stop_requested
from buffer.schema import decode_group, encode_group, make_group_id
from buffer.telemetry import Telemetry
from buffer.tickets import (
    TicketDispenser,
    admission_limit,
    draw_batch,
    draw_key,
    draw_round,
    fixed_policy_version,
    round_tickets,
    synced_version,
    ticket_batch,
    ticket_draw,
    ticket_round,
)
from buffer.versions import VersionRegistry

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from torch import nn

    from buffer.rewind import BoundedRewind
    from buffer.timeline import Timeline

__all__ = [
    "BufferConnectionError",
    "BufferFullError",
    "Check",
    "Delivery",
    "IntakeRules",
    "RecordError",
    "RolloutConsumer",
    "RolloutGroup",
    "RolloutProducer",
    "RolloutSink",
    "RolloutSource",
    "RunKeys",
    "SlotRefusedError",
    "TakeResult",
    "Telemetry",
    "TelemetryReader",
    "TicketDispenser",
    "VersionPublisher",
    "VersionRegistry",
    "WeightWriter",
    "admission_limit",
    "clear_stop",
    "connect",
    "decode_group",
    "delete_run",
    "draw_batch",
    "draw_key",
    "draw_round",
    "encode_group",
    "fixed_policy_version",
    "make_group_id",
    "redact",
    "request_stop",
    "round_tickets",
    "stop_requested",
    "synced_version",
    "ticket_batch",
    "ticket_draw",
    "ticket_round",
]


# ---- the learner's and the generator's view: what they call, nothing more ----------------------
# RolloutProducer, RolloutConsumer, buffer.weight_store.WeightStore, VersionRegistry and Telemetry
# satisfy these
# structurally, so the learner's signatures name what it uses, not the Redis-backed classes.


class RolloutSink(Protocol):
    """Where a generator pushes its groups (RolloutProducer)."""

    def push(self, group: RolloutGroup, batch_index: int, ticket: int | None = None) -> str: ...

    def push_many(
        self,
        groups: Sequence[RolloutGroup],
        batch_index: int,
        tickets: Sequence[int | None] | None = None,
        timeline: int = 0,
    ) -> list[str]: ...


class RolloutSource(Protocol):
    """Where the learner takes groups from and settles them (RolloutConsumer)."""

    def take_batch(
        self,
        batch_index: int,
        n_groups: int,
        consumer: str,
        timeout_s: float,
        *,
        rules: IntakeRules | None = None,
        slots: Container[str] = (),
    ) -> list[Delivery]:
        """Fixed staleness: exactly the groups of batch `batch_index` that `rules` pass;
        SlotRefusedError when a group whose id is in `slots` was refused and cannot come again."""
        ...

    def take(
        self,
        n_groups: int,
        learner_version: int,
        max_lag: int,
        consumer: str,
        timeout_s: float,
        *,
        rules: IntakeRules | None = None,
        timeline: Timeline | None = None,
    ) -> TakeResult:
        """Bounded staleness: the next groups in arrival order with lag <= max_lag (groups made
        from weights `timeline` says were withdrawn: dropped, their tickets reissued)."""
        ...

    def request_round(self, batch_index: int, round_index: int, prompts_per_step: int) -> int:
        """Fixed mode, dynamic sampling: ask the generators for extra round `round_index` of
        batch `batch_index` (taken as `take_batch(draw_key(batch, round), ...)`); idempotent."""
        ...

    def reject(self, deliveries: Iterable[Delivery], reason: str, consumer: str) -> None:
        """Dead-letter taken groups that must not be trained, with the reason."""
        ...

    def commit(self, deliveries: Iterable[Delivery]) -> None:
        """Mark trained and acknowledge, after the step is checkpointed."""
        ...

    def ack(self, entry_ids: Iterable[str]) -> None:
        """Acknowledge without marking trained (redelivered copies of trained groups)."""
        ...

    def committed_beyond(self, trained_group_ids: Container[str]) -> list[str]:
        """Ids Redis has committed as trained that `trained_group_ids` (a checkpoint's) lacks."""
        ...

    def recommit(self, trained_group_ids: Collection[str]) -> int:
        """Record a checkpoint's trained ids as trained and settle their entries still pending
        (a commit a killed learner did not get to); returns how many entries it settled."""
        ...

    def rewind(self, group_ids: Collection[str]) -> object:
        """Make groups committed after a checkpoint generable and trainable again, each only as
        the copy that was trained (`buffer.rewind`: a fixed-mode resume replays them)."""
        ...

    def rewind_bounded(self, group_ids: Collection[str], to_version: int) -> BoundedRewind:
        """Bounded mode: groups committed after the checkpoint of step `to_version` become
        fresh work and the versions after it are withdrawn (`buffer.rewind.rewind_bounded`)."""
        ...

    def timeline(self) -> Timeline:
        """The run's rewinds so far (`buffer.timeline`)."""
        ...


class WeightWriter(Protocol):
    """Where the learner writes each policy version's weights (WeightStore)."""

    def write(
        self,
        version: int,
        weights: nn.Module | Mapping[str, torch.Tensor],
        config_dir: Path | None = None,
    ) -> str:
        """Write `version` (with the base model's config files) and return its location."""
        ...

    def prune(self, keep: int, protect: Iterable[int] = ()) -> list[int]:
        """Remove all but the newest `keep` versions, never one in `protect`."""
        ...

    def path(self, version: int) -> str:
        """Where `version` is (FileNotFoundError when it was never written or was pruned)."""
        ...


class VersionPublisher(Protocol):
    """The learner's side of the policy-version registry (VersionRegistry)."""

    def publish(self, version: int, location: str) -> None: ...

    def current(self) -> tuple[int, str] | None: ...

    def rewound(self, version: int, timeline: int) -> None:
        """This learner rewound the registry to `version` (`buffer.rewind.rewind_bounded`)."""
        ...


class TelemetryReader(Protocol):
    """The buffer's counters and the generators' figures, read at each learner step (Telemetry)."""

    def buffer_metrics(self) -> dict[str, float]: ...

    def generator_metrics(self) -> dict[str, float]: ...
