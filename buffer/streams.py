"""The buffer's public interface: import what a generator or a learner needs from here.

Generator worker::

    with connect(cfg.buffer.redis_url, cfg.buffer.tls_ca_file) as client:
        buffer = RolloutBuffer(client, run_id, cfg.buffer)
        tickets = TicketDispenser(client, run_id)
        versions = VersionRegistry(client, run_id)
        while not buffer.stop_requested():
            version, location = versions.current()          # after the learner published v0
            ticket = tickets.claim(generator_id, admission_limit(version, lag, prompts_per_step))
            if ticket is None: versions.wait_for_version(version + 1, timeout_s); continue
            batch = ticket_batch(ticket, prompts_per_step)
            # fixed mode: weights of exactly fixed_policy_version(batch, lag); bounded: latest
            buffer.push(group, batch, ticket=ticket)             # completes the ticket

Learner loop::

    deliveries = buffer.take_batch(step, prompts_per_step, consumer, timeout_s)     # fixed
    deliveries = buffer.take(prompts_per_step, step, max_lag, consumer, timeout_s).deliveries
    batch = collate([d.group for d in deliveries], pad_id)     # buffer.collate
    ... train, checkpoint (with the trained group ids) ...
    buffer.commit(deliveries)          # or mark_trained(ids) then ack(entry_ids)
    versions.publish(step + 1, location)
"""

from __future__ import annotations

from buffer.connection import BufferConnectionError, RunKeys, connect, redact
from buffer.inbox import Delivery
from buffer.outbox import BufferFullError
from buffer.rollout_buffer import RolloutBuffer, RolloutSink, RolloutSource, TakeResult
from buffer.schema import RecordError, RolloutGroup, decode_group, encode_group, make_group_id
from buffer.telemetry import Telemetry
from buffer.tickets import TicketDispenser, admission_limit, fixed_policy_version, ticket_batch
from buffer.versions import VersionRegistry

__all__ = [
    "BufferConnectionError",
    "BufferFullError",
    "Delivery",
    "RecordError",
    "RolloutBuffer",
    "RolloutGroup",
    "RolloutSink",
    "RolloutSource",
    "RunKeys",
    "TakeResult",
    "Telemetry",
    "TicketDispenser",
    "VersionRegistry",
    "admission_limit",
    "connect",
    "decode_group",
    "encode_group",
    "fixed_policy_version",
    "make_group_id",
    "redact",
    "ticket_batch",
]
