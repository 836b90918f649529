"""The learner's shared vocabulary: the names a config may choose among (design section 6).

A leaf module: it imports nothing of this repository and no torch, so the pure math
(`learner.algorithms`), the configuration (`learner.config`) and the runtime
(`learner.runtime`) can all take their `Literal` types from here without importing each other.
Each name is declared once; the modules that give it meaning say what it does.
"""

from __future__ import annotations

from typing import Literal

Objective = Literal[
    "gspo", "gspo_token", "grpo", "ppo", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov"
]
"""The policy objectives an arm can train, one config model each (`learner.config.arms`, then
`learner.config.arms_zoo`)."""

LossAggregation = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
"""How per-token loss terms become one number (`learner.algorithms.masking`)."""

AdvantageNorm = Literal["std", "mean_only"]
"""Group advantage normalisation: divide by the group std, or only subtract the mean (Dr. GRPO)."""

AdvantageStd = Literal["unbiased", "population"]
"""Which group std `adv_norm: std` divides by: Bessel-corrected (divide by G - 1, torch's
default, as verl's `compute_grpo_outcome_advantage` and TRL's `GRPOTrainer`) or the population
std (divide by G, this harness's only convention before issue 37): its advantages are
sqrt(G / (G - 1)) times the unbiased ones, 1.069 at G = 8, 1.155 at G = 4, 1.41 at G = 2."""

AdvantageEstimator = Literal["group", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
"""How a group arm turns sequence rewards into one advantage per sequence [B]
(`learner.algorithms.advantages.ADVANTAGE_ESTIMATORS`): group mean/std (`adv_norm`), RLOO's
leave-one-out baseline, REINFORCE++'s batch whitening, or REINFORCE++-baseline."""

KLEstimator = Literal["k1", "k2", "k3"]
"""Schulman's estimators of a KL divergence from sampled log-ratios (`learner.algorithms.kl`)."""

AdvantageKind = Literal["group", "gae"]
"""`group`: one advantage per sequence [B] from the rewards alone (GRPO/GSPO; sequence-level),
by the arm's `adv_estimator` (group-relative, RLOO, or REINFORCE++'s batch normalisation).
`gae`: GAE on the critic's values with a terminal reward, whitened, per token [B, T] (PPO)."""

LossUnits = Literal["tokens", "sequences"]
"""What a policy loss averages over: response tokens (token-mean) or non-empty sequences."""

Correction = Literal[
    "naive",
    "proximal",
    "decoupled",
    "tis_token",
    "tis_seq",
    "mis_token",
    "mis_seq",
    "mis_geo",
    "icepop",
]
"""Off-policy corrections (`learner.algorithms.corrections` defines each)."""

CorrectionLevel = Literal["token", "sequence"]
"""Whether a correction's weight is per token or one per sequence."""

OldLogprobs = Literal["behavior", "recompute"]
"""Default correction of arms that set none: naive (behaviour logprobs) or tis_token."""

LRSchedule = Literal["constant", "cosine"]
"""The learning rate after warm-up."""

AdamWKernels = Literal["fused", "foreach", "for_loop"]
"""How AdamW steps: one kernel, foreach ops over every tensor, or tensor by tensor."""

OptimizerImpl = Literal["auto", AdamWKernels]
"""`learner.optimizer_impl`: the kernels, or `auto` (`LearnerConfig.resolved_optimizer_impl`)."""

RoutingReplay = Literal["off", "old", "rollout"]
"""MoE routing replay: none, the learner's start-of-step experts (R2), the generator's (R3)."""
