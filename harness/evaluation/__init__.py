"""The learner's periodic evals: every eval set scored greedily and with k samples (pass@k)."""
