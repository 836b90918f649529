"""Tasks and verifiers: prompt streams with held-out eval splits, and the rewards scoring them."""
