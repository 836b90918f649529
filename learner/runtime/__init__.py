"""The learner's runtime: the training loop, one step, intake checks, checkpoints, models,
data-parallel ranks, routing replay and the step's outputs. It applies `learner.algorithms` to
batches from the buffer under `learner.config`."""
