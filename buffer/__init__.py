"""Rollout buffer: Arrow record schema, Redis streams, staleness admission, policy versions."""
