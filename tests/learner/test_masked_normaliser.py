"""The normaliser convention: tokens (and sequences) masked by a filter stay in the denominator.

Every mask the learner applies on top of the response mask (a correction's `mis_*` / `icepop` /
capped `decoupled` rejection, Clip-Cov's detached tokens) zeroes the term's weight and leaves the
response mask, hence the count, alone (`learner.algorithms.masking.aggregate_padded`). AReaL does
the same: its loss mask count is taken before the behaviour-weight mask. Only prompt and padding
positions are outside the count.
"""

from __future__ import annotations

import pytest
import torch

from learner.algorithms.correction_spec import correction_spec
from learner.algorithms.corrections import correction_weights
from tests.learner.objective_inputs import (
    layout,
    leaf,
    opts,
    response,
    run,
)

# Three rows, identical pi_theta = pi_old = pi_prox (every ratio r_t = 1), so each token's term
# is L_t = -A_i w_t. mis_token with cap 2 keeps w_t = rho_t = 1 and masks rho_t = 4 (w_t = 0):
#   row 0: tokens a b c, A = +1,   rho = (1, 4, 1) -> w = (1, 0, 1)   b masked
#   row 1: tokens d e,   A = -0.5, rho = (1, 1)    -> w = (1, 1)
#   row 2: tokens f g,   A = +2,   rho = (4, 4)    -> w = (0, 0)      the whole sequence masked
# Each row also has 2 prompt slots and right padding (`layout`), outside the response mask.
RHO = [[1.0, 4.0, 1.0], [1.0, 1.0], [4.0, 4.0]]
ADV = torch.tensor([1.0, -0.5, 2.0])


def masked_batch():
    """(pi_theta leaf, pi_old, mask, mis_token weights) of the rows above."""
    pi_prox, mask = layout([[-0.5, -1.0, -0.7], [-0.2, -1.5], [-0.9, -0.4]])
    rho, _ = layout(RHO, junk=1.0)
    behaviour = torch.where(mask, pi_prox - torch.log(rho), 0.0)  # mu = pi_prox / rho
    weights, stats = correction_weights(correction_spec("mis_token"), pi_prox, behaviour, mask)
    assert weights is not None
    assert response(weights, mask) == [[1.0, 0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    assert stats["masked_frac"] == pytest.approx(3 / 7)  # b, f, g of 7 response tokens
    return leaf(pi_prox), pi_prox, mask, weights


def test_token_mean_keeps_masked_tokens_in_the_denominator() -> None:
    # Numerator: row 0 -1 + 0 - 1 = -2; row 1 +0.5 + 0.5 = +1; row 2 0 + 0 = 0; total -1.
    # Denominator: every response token, masked or not: 3 + 2 + 2 = 7 (padding excluded).
    # Loss -1/7 = -0.142857; dropping b, f, g would give -1/4 and weigh each survivor 1/4.
    # Gradient dL/dlog pi_t = -A_i w_t / 7: a, c -1/7; b 0; d, e +0.5/7; f, g 0.
    logprobs, old, mask, weights = masked_batch()
    loss, _ = run(
        "grpo", logprobs, old, ADV, mask, opts("grpo", agg="token-mean"), is_weights=weights
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1 / 7, rel=1e-6)
    expected = [[-1 / 7, 0.0, -1 / 7], [0.5 / 7, 0.5 / 7], [0.0, 0.0]]
    for got, want in zip(response(logprobs.grad, mask), expected, strict=True):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12)


def test_sequence_means_keep_masked_tokens_and_sequences_in_their_denominators() -> None:
    # seq-mean-token-mean: row means -2/3 (b still counted: / 3, not / 2), +1/2, 0/2 = 0; then
    # the mean over all 3 non-empty rows (row 2 masked but counted): (-2/3 + 1/2 + 0) / 3 =
    # -1/18 = -0.055556. Dropping the masks would give (-1 + 1/2) / 2 = -1/4.
    # GSPO: s_i = 1 scaled by the mean weight 2/3, 1, 0, so the same (-2/3 + 1/2 + 0) / 3.
    for name, options in (("grpo", opts("grpo")), ("gspo", opts("gspo"))):
        logprobs, old, mask, weights = masked_batch()
        loss, _ = run(name, logprobs, old, ADV, mask, options, is_weights=weights)
        assert loss.item() == pytest.approx(-1 / 18, rel=1e-6), name
