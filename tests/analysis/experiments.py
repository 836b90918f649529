"""The synthetic experiment the whole-report tests start from, kept in one place.

Each test module derives its own with `dataclasses.replace`, adding only the features it
exercises, so what the modules share cannot drift apart.
"""

from __future__ import annotations

from analysis.synthetic import SyntheticSpec

# Two arms of different skill, 3 seeds x lags {0, 2}, 30 steps with an eval every 10; grpo's seed
# 1 diverges at lag 2 (step 15), so every report shows a divergence.
TWO_ARMS = SyntheticSpec(
    skill={"gspo": 0.7, "grpo": 0.55},
    seeds=(0, 1, 2),
    lags=(0, 2),
    steps=30,
    eval_every=10,
    diverged=(("grpo", 1, 2, 15),),
)
