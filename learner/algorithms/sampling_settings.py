"""The sampled distribution's settings (temperature, top-p, top-k), without torch.

The config validates them and the learner and generators compute with them
(`learner.algorithms.sampling_dist`); kept apart so that reading a config imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

# vLLM's SamplingParams silently raises temperatures below 0.01 to 0.01 (`_MAX_TEMP`, with a
# warning) and rejects ones above 2, so no other temperature can be reproduced by the learner.
MIN_TEMPERATURE = 0.01
MAX_TEMPERATURE = 2.0


@dataclass(frozen=True)
class SamplingSettings:
    """Temperature, top-p and top-k of the sampled distribution (shared by all arms of a trial).

    The generators sample from it and the learner scores under it. Generators apply it per
    request, so a generator's `sampling` attribute may be replaced between calls.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (vLLM's convention)

    def __post_init__(self) -> None:
        if not MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(
                f"temperature={self.temperature} must be in [{MIN_TEMPERATURE}, "
                f"{MAX_TEMPERATURE}] (vLLM clamps lower values and rejects higher ones); use "
                "`greedy` for argmax decoding"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]; 1 turns nucleus sampling off")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0; 0 turns top-k sampling off")

    @property
    def truncates(self) -> bool:
        """True when some tokens may get probability 0 (top-p < 1 or top-k on)."""
        return self.top_p < 1.0 or self.top_k > 0


PLAIN = SamplingSettings()
"""T = 1, no top-p, no top-k: the model's own softmax."""
