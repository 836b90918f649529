"""The buffer tests' fixtures (a checked client, a buffer with short timeouts), shared."""

from tests.buffer.conftest import buffer, client

__all__ = ["buffer", "client"]
