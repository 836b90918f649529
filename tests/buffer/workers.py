"""Worker processes for the failure tests: real processes using the library, killed for real.

Run as `python -m tests.buffer.workers COMMAND ...` (subprocess) or as multiprocessing targets.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from buffer.connection import connect
from buffer.consumer import RolloutConsumer
from buffer.producer import RolloutProducer
from buffer.tickets import TicketDispenser, admission_limit, ticket_batch
from buffer.versions import VersionRegistry
from tests.buffer.factories import RUN_ID, fast_config, make_group


def take_and_hang(url: str, n_groups: int, consumer: str) -> None:
    """Take batch 0, report the entry ids on stdout, then hang before acking (to be SIGKILLed)."""
    buffer = RolloutConsumer(connect(url), RUN_ID, fast_config())
    deliveries = buffer.take_batch(0, n_groups, consumer=consumer, timeout_s=10)
    print(json.dumps([d.entry_id for d in deliveries]), flush=True)
    time.sleep(600)


def claim_and_hang(url: str, generator_id: str, lease_s: float) -> None:
    """Claim one ticket, report it, then hang without pushing (a generator that crashes)."""
    tickets = TicketDispenser(connect(url), RUN_ID, lease_s=lease_s)
    print(json.dumps(tickets.claim(generator_id, limit=100)), flush=True)
    time.sleep(600)


def produce_bounded(url: str, generator_id: str, prompts_per_step: int, max_lag: int) -> None:
    """A free-running generator: admission-limited claims, latest weights, push with ticket."""
    client = connect(url)
    producer = RolloutProducer(client, RUN_ID, fast_config(max_depth=64, push_timeout_s=30))
    tickets = TicketDispenser(client, RUN_ID)
    versions = VersionRegistry(client, RUN_ID)
    rng = random.Random(generator_id)
    while not producer.stop_requested():
        version, _location = versions.current()
        ticket = tickets.claim(generator_id, admission_limit(version, max_lag, prompts_per_step))
        if ticket is None:
            time.sleep(0.01)
            continue
        time.sleep(rng.uniform(0.0, 0.03))  # "generation"
        batch = ticket_batch(ticket, prompts_per_step)
        group = make_group(ticket, batch, policy_version=version, generator_id=generator_id)
        producer.push(group, batch, ticket=ticket)
    client.close()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    take = sub.add_parser("take-and-hang")
    take.add_argument("url")
    take.add_argument("n_groups", type=int)
    take.add_argument("consumer")
    claim = sub.add_parser("claim-and-hang")
    claim.add_argument("url")
    claim.add_argument("generator_id")
    claim.add_argument("lease_s", type=float)
    args = parser.parse_args(argv)
    if args.command == "take-and-hang":
        take_and_hang(args.url, args.n_groups, args.consumer)
    else:
        claim_and_hang(args.url, args.generator_id, args.lease_s)


if __name__ == "__main__":
    main(sys.argv[1:])
