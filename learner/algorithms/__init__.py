"""The learner's pure tensor math: objectives, corrections, advantages, KL, masking and the
sampling distribution.

Functions of tensors and of the settings they read only: nothing here imports the pydantic
config (`learner.config`) or the runtime (`learner.runtime`); an objective reads its arm through
structural Protocols (`learner.algorithms.objectives.settings`), and shared names come from
`learner.vocabulary`. This file imports nothing, so `learner.algorithms.correction_spec` stays
torch-free for the config.
"""
