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

# The report shapes whose figures must stay readable (issue 37): four arms over five lags, and
# the quickstart's (four arms, lag 0 only, five seeds, two eval sets). Small in steps and seeds:
# the figures' layout depends on arms, lags and eval sets, not on how long the trials ran.
FOUR_ARMS = {"gspo": 0.7, "grpo": 0.6, "ppo": 0.5, "grpo_lr_tenth": 0.45}
FOUR_BY_FIVE = SyntheticSpec(
    skill=FOUR_ARMS,
    seeds=(0, 1),
    lags=(0, 1, 2, 4, 8),
    steps=10,
    eval_every=5,
    rows_per_part=50,
    eval_sets=("heldout", "hard"),
    tokens_per_step=1000.0,
    corrections=True,
)
QUICKSTART_SHAPED = SyntheticSpec(
    experiment="quickstart",
    skill=FOUR_ARMS,
    seeds=(0, 1, 2, 3, 4),
    lags=(0,),
    steps=30,
    eval_every=5,
    rows_per_part=50,
    eval_sets=("addition2", "addition2_q"),
    tokens_per_step=1000.0,
    corrections=True,  # every run logs ESS and staleness times, correction or not
)
