"""Learner: objectives as pure functions, advantage and KL estimators, the training loop."""
