"""What a learner step's memory depends on besides the model (`LearnerSetup`), and the byte
sizes every part of the estimate counts in."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from learner.vocabulary import AdamWKernels

F32 = 4
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
ADAM_MOMENT_BYTES = 2 * F32  # exp_avg, exp_avg_sq in float32
INDEX_BYTES = 8  # int64


@dataclass(frozen=True)
class LearnerSetup:
    """What a step's memory depends on besides the model; `gpus` is the number of ranks."""

    gpus: int = 1
    parallel: Literal["ddp", "fsdp"] = "ddp"
    dtype: Literal["float32", "bfloat16"] = "float32"
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    groups: int = 8  # prompts per step (learner.prompts_per_step)
    group_size: int = 8  # samples per prompt (generation.group_size)
    minibatches: int = 1
    seq_len: int = 64  # padded row width: prompt + response tokens
    micro_batch_tokens: int | None = None
    logprob_chunk_tokens: int | None = None
    critic: bool = False  # PPO's value model (a copy of the backbone, trained)
    reference: bool = False  # frozen reference policy (beta > 0)
    truncated_sampling: bool = False  # top-p < 1 or top-k > 0: sort copies of the logits
    # how AdamW steps (`LearnerConfig.resolved_optimizer_impl`); torch's default on the CPU
    optimizer_impl: AdamWKernels = "for_loop"

    @property
    def step_rows(self) -> int:
        return self.groups * self.group_size

    @property
    def share_rows(self) -> int:
        """Rows a rank trains per minibatch: its whole groups of the largest minibatch."""
        per_minibatch = math.ceil(self.groups / self.minibatches)
        return math.ceil(per_minibatch / self.gpus) * self.group_size

    @property
    def micro_rows(self) -> int:
        """Rows of the largest micro-batch, every row at full width (`update.micro_batches`:
        rows x width within the budget, at least one row)."""
        if self.micro_batch_tokens is None:
            return self.share_rows
        return min(self.share_rows, max(1, self.micro_batch_tokens // self.seq_len))

    @property
    def micro_batches(self) -> int:
        return math.ceil(self.share_rows / self.micro_rows)

    @property
    def scoring_rows(self) -> int:
        """Rows of the largest micro-batch of the passes without gradient, which split the
        whole step batch (every row, on every rank) by the same budget (`step._no_grad_pass`):
        the whole batch when `learner.micro_batch_tokens` is unset."""
        if self.micro_batch_tokens is None:
            return self.step_rows
        return min(self.step_rows, max(1, self.micro_batch_tokens // self.seq_len))

    @property
    def compute_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]
