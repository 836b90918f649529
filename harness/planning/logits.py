"""Bytes of a log-prob pass's logit-sized tensors (`learner.runtime.forward`,
`learner.algorithms.sampling_dist`): the model's logits, the sampling distribution's copies, the
entropy's temporaries and the backward through the log-softmax. A pure function of a shape and a
setup; `memory.estimate` puts it at each moment that holds logits."""

from __future__ import annotations

from harness.planning.architecture import ModelShape
from harness.planning.setup import F32, LearnerSetup

LOGIT_COPY_BYTES = 8
"""float32 bytes per logit beside the model's own logits (in the compute dtype) while
`learner.algorithms.sampling_dist.processed_logprobs` runs (`learner.runtime.forward._score`):
the temperature-scaled copy (4) and its log-softmax (4). A bf16 model's float32 cast (4) lives
only until the division has made the scaled copy, so the division peaks no higher."""
TRUNCATED_LOGIT_COPY_BYTES = 24
"""With top-p (sampling_dist._dropped): the scaled logits (4), sorted values (4), sort order
(int64, 8), softmax (4) and cumulative sum (4) at once."""
ENTROPY_ROWS = 128
"""`learner.runtime.forward.ENTROPY_ROWS`: positions whose entropy is reduced at once."""
ENTROPY_COPY_BYTES = 4
"""Bytes per logit of `ENTROPY_ROWS` positions that the entropy makes beside the log-softmax
(`forward._rows_entropy`): p log p, one float32 copy updated in place."""
BACKWARD_LOGIT_BYTES = 12
"""float32 bytes per logit in a gradient pass's backward through the log-softmax: its saved
output, the incoming gradient (gather's scatter of the log-probs' gradient) and the gradient it
returns. The compute-dtype logits are not saved; their gradient (2 or 4) comes after."""


def logit_bytes(
    shape: ModelShape, setup: LearnerSetup, tokens: int, *, chunked: bool, backward: bool = False
) -> float:
    """The peak of the log-prob pass's logit-sized tensors, for `tokens` positions, or for one
    chunk of `learner.logprob_chunk_tokens` when chunked (and it is set); with `backward`, of
    a gradient pass (the update), whose backward through the log-softmax may peak higher.

    Three moments (`learner.runtime.forward._score`): while the sampling distribution's
    log-softmax is made, the model's logits beside `LOGIT_COPY_BYTES` (top-k / top-p:
    `TRUNCATED_LOGIT_COPY_BYTES`); while the entropy is reduced, the log-softmax and one
    `ENTROPY_ROWS` sub-chunk's `ENTROPY_COPY_BYTES`, beside the model's logits only unchunked
    (the causal LM's output still holds them; a chunk's are freed after its log-softmax); and
    in backward `BACKWARD_LOGIT_BYTES`."""
    chunk = setup.logprob_chunk_tokens
    split = chunked and chunk is not None
    positions = min(tokens, chunk) if split and chunk else tokens
    b, logits = setup.compute_bytes, positions * shape.vocab
    copies = TRUNCATED_LOGIT_COPY_BYTES if setup.truncated_sampling else LOGIT_COPY_BYTES
    held = 0 if split else b  # unchunked: the model's logits outlive the log-softmax
    sub_chunk = min(positions, ENTROPY_ROWS) * shape.vocab
    moments = [logits * (b + copies), logits * (F32 + held) + sub_chunk * ENTROPY_COPY_BYTES]
    return float(max(moments + ([logits * BACKWARD_LOGIT_BYTES] if backward else [])))
