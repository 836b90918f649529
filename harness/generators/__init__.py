"""Rollout generators: sample groups of responses with behaviour logprobs (torch or vLLM).

Backends are imported on demand by `make_generator`, so importing this package never imports vLLM.
"""

from harness.generators.base import (
    FinishReason,
    GenerationTimeoutError,
    Generator,
    GenRequest,
    GenResult,
    SamplingSettings,
    sample_seed,
)
from harness.generators.factory import make_generator

__all__ = [
    "FinishReason",
    "GenRequest",
    "GenResult",
    "GenerationTimeoutError",
    "Generator",
    "SamplingSettings",
    "make_generator",
    "sample_seed",
]
