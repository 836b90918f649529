"""The buffer tests' fixtures (a checked client, both sides of a buffer), shared."""

from tests.buffer.conftest import client, consumer, producer

__all__ = ["client", "consumer", "producer"]
