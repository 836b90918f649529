"""Experiment harness: configuration, CLI, tasks, model factory, generators and supervision."""
