"""The learner's pure tensor math: objectives, corrections, advantages, KL, masking and the
sampling distribution.

Functions of tensors and frozen option values only: nothing here imports the pydantic config
(`learner.config`) or the runtime (`learner.runtime`); shared names come from
`learner.vocabulary`. This file imports nothing, so `learner.algorithms.options` stays torch-free.
"""
