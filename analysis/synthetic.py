"""Synthetic experiment directories in the trial runner's on-disk format, for tests and demos.

Writes `root/trials/<name>/trial.json` and `metrics.parquet/part-NNNNNN.parquet` through the
learner's writer (`contract.step_tables`: one row per step, NaN where a metric was not measured;
`rows_per_part` steps per part, the learner's one when 1), with known effects: each
arm has a skill, each seed a shared offset (so matched seeds are correlated, as in the real
harness), and larger lags trade a little score for throughput.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

from contract import evals as ev
from contract import metrics as mn
from contract import rollout_log as rl
from contract import step_tables
from contract.layout import ExperimentPaths, TrialPaths
from contract.trial import StalenessMode, TrialStatus

START_S = 1.7e9  # every synthetic trial starts at this epoch second; steps are stamped after it
STARTED_AT = datetime.fromtimestamp(START_S, UTC).isoformat()


@dataclass(frozen=True)
class SyntheticSpec:
    """What to generate. `skill` maps arm -> asymptotic pass rate at lag 0."""

    experiment: str = "synthetic"
    skill: dict[str, float] = field(default_factory=lambda: {"gspo": 0.7, "grpo": 0.6, "ppo": 0.5})
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    lags: tuple[int, ...] = (0, 1, 4)
    steps: int = 60
    eval_every: int = 10
    # Steps per metrics part, each named by its first step. 1 is the learner's layout; more keeps
    # big synthetic experiments quick to write and read (the reader does not care).
    rows_per_part: int = 25
    seed_sd: float = 0.05  # between-seed offset shared by all arms of a seed
    noise_sd: float = 0.02  # eval noise per measurement
    lag_penalty: float = 0.02  # pass-rate loss per unit of lag
    # Per arm, the pass-rate loss per unit of lag instead of `lag_penalty` (a correction that
    # recovers the staleness cost: 0.0); arms not named use `lag_penalty`.
    lag_penalties: dict[str, float] = field(default_factory=dict)
    diverged: tuple[tuple[str, int, int, int], ...] = ()  # (arm, seed, lag, step it diverged)
    failed: tuple[tuple[str, int, int], ...] = ()  # (arm, seed, lag) crashed with status failed
    mode: StalenessMode = "fixed"
    # Also write the off-policy, staleness-accounting and MoE columns (analysis.sections.
    # corrections), with known effects: ESS falls and drops rise with lag; dropped groups score
    # lower and run longer than trained ones, so the trained-vs-read bias is positive on reward,
    # negative on length. Off by default: its own rng, so the other columns do not change with it.
    corrections: bool = False
    prompts_per_step: int = 8  # trained groups per step, for the per-step bias metrics
    # Eval suites: also write evals.parquet with these eval sets (the first is the primary one,
    # equal to eval/pass_rate; set j scores 0.1 j lower), sampled pass@1 and pass@k. Empty: the
    # trial has only eval/pass_rate, like trials written before eval suites.
    eval_sets: tuple[str, ...] = ()
    pass_at: tuple[int, ...] = (4,)
    # Mean response tokens generated per step (tokens/generated); the arm listed i-th in `skill`
    # costs (1 + 0.25 i) times as much. 0: the column is not written (older trials).
    tokens_per_step: float = 0.0
    # Also write rollouts.parquet (contract.rollout_log) at the steps `learner.rollout_log.every:
    # eval_every` logs: `rollout_groups` addition prompts of 4 samples, correct (an
    # `<answer>` tag with the sum) at the trial's pass rate. Off: no rollout log, like trials
    # written before it existed.
    rollouts: bool = False
    rollout_groups: int = 4
    # (arm, seed, lag, seconds): that trial's rows are stamped this much later, as if its
    # start-up (trial start to first learner update, analysis.wall_clock) took longer.
    startup: tuple[tuple[str, int, int, float], ...] = ()
    # arm -> its off-policy correction, written to each trial's resolved_config.yaml (`arms`).
    # Empty: no resolved config, like trials written before it existed.
    arm_corrections: dict[str, str] = field(default_factory=dict)


def _pass_rate(
    spec: SyntheticSpec,
    arm: str,
    seed: int,
    lag: int,
    steps: np.ndarray,
    *,
    rng: np.random.Generator,
) -> np.ndarray:
    offset = np.random.default_rng(1000 + seed).normal(0, spec.seed_sd)  # same for every arm
    top = spec.skill[arm] - spec.lag_penalties.get(arm, spec.lag_penalty) * lag + offset
    curve = 0.1 + (top - 0.1) * (1 - np.exp(-steps / (spec.steps / 4)))
    return np.clip(curve + rng.normal(0, spec.noise_sd, len(steps)), 0, 1)


def correction_columns(
    spec: SyntheticSpec, arm: str, seed: int, lag: int, reward: np.ndarray
) -> dict[str, np.ndarray]:
    """Per-step correction metrics consistent with the contract's definitions (bias_* included)."""
    rng = np.random.default_rng(zlib.crc32(f"corrections/{arm}/{seed}/{lag}".encode()))
    n, p = len(reward), spec.prompts_per_step
    dropped = rng.poisson(0.4 * lag, n).astype(float) if spec.mode == "bounded" else np.zeros(n)
    length = 120 - 60 * reward + rng.normal(0, 3, n)
    some = dropped > 0
    dropped_reward = np.where(some, np.clip(reward - 0.2, 0, 1), np.nan)
    dropped_length = np.where(some, length + 40, np.nan)
    generation = 0.5 * rng.uniform(0.9, 1.1, n)
    queue = 0.2 * lag * rng.uniform(0.9, 1.1, n)
    return {
        mn.LENGTH_MEAN: length,
        mn.OFFPOLICY_ESS_FRAC: np.clip(1 / (1 + 0.1 * lag) + rng.normal(0, 0.01, n), 0, 1),
        mn.OFFPOLICY_WEIGHT_MEAN: 1 + rng.normal(0, 0.01, n),
        mn.OFFPOLICY_MASKED_FRAC: np.full(n, 0.01 * lag),
        mn.OFFPOLICY_TRUNC_FRAC: np.full(n, 0.02 * lag),
        mn.STALENESS_MEAN: np.full(n, float(lag)),
        mn.STALENESS_GENERATION_S: generation,
        mn.STALENESS_QUEUE_S: queue,
        mn.STALENESS_AGE_S: generation + queue,
        mn.STALENESS_DROPPED: dropped,
        mn.STALENESS_DROPPED_REWARD_MEAN: dropped_reward,
        mn.STALENESS_DROPPED_LENGTH_MEAN: dropped_length,
        # trained mean - mean over the P trained and d dropped groups = d (T - D) / (P + d)
        mn.STALENESS_BIAS_REWARD: np.where(some, dropped * (reward - dropped_reward), 0)
        / (p + dropped),
        mn.STALENESS_BIAS_LENGTH: np.where(some, dropped * (length - dropped_length), 0)
        / (p + dropped),
        mn.STALENESS_KL_BEHAVIOR: np.full(n, np.nan)
        if lag == 0
        else 2e-3 * lag * rng.lognormal(0, 0.2, n),
        mn.MISMATCH_KL_BEHAVIOR: 1e-4 * rng.lognormal(0, 0.2, n),
        mn.MOE_ROUTING_CHANGE_FRAC: 0.02 + 0.005 * lag + rng.normal(0, 0.002, n),
        mn.MOE_ROLLOUT_ROUTING_MISMATCH: 0.05 + rng.normal(0, 0.005, n),
    }


def trial_table(
    spec: SyntheticSpec, arm: str, seed: int, lag: int, last_step: int, *, startup: float = 0.0
) -> pa.Table:
    """One trial's step rows 0..last_step with all the metrics the report reads; `startup`
    seconds more before the first row."""
    rng = np.random.default_rng(zlib.crc32(f"{arm}/{seed}/{lag}".encode()))  # stable across runs
    steps = np.arange(last_step + 1)
    evals = np.full(len(steps), np.nan)
    is_eval = (steps % spec.eval_every == 0) | (steps == spec.steps)
    evals[is_eval] = _pass_rate(spec, arm, seed, lag, steps[is_eval].astype(float), rng=rng)
    step_s = 1.0 / (1.0 + 0.6 * lag) * rng.uniform(0.9, 1.1, len(steps))
    grad = rng.lognormal(0, 0.2, len(steps))
    grad[rng.random(len(steps)) < 0.03] *= 50  # rare spikes
    kl = 1e-3 * (1 + lag) * rng.lognormal(0, 0.3, len(steps))
    clip = np.clip(0.05 * (1 + 0.5 * lag) + rng.normal(0, 0.01, len(steps)), 0, 1)
    columns = {
        mn.STEP: pa.array(steps, pa.int64()),
        mn.TIMESTAMP: pa.array(START_S + startup + np.cumsum(step_s), pa.float64()),
        mn.EVAL_PASS_RATE: evals,
        mn.REWARD_MEAN: np.clip(0.8 * np.nan_to_num(evals, nan=0.5) + 0.1, 0, 1),
        mn.OPTIM_GRAD_NORM: grad,
        mn.POLICY_KL_OLD: kl,
        mn.POLICY_CLIP_FRAC: clip,
        mn.PERF_LEARNER_STEP_S: step_s,
        mn.PERF_LEARNER_WAIT_FRAC: np.clip(0.5 / (1 + lag) + rng.normal(0, 0.02, len(steps)), 0, 1),
        mn.PERF_GEN_IDLE_FRAC: np.clip(0.4 / (1 + lag) + rng.normal(0, 0.02, len(steps)), 0, 1),
    }
    if spec.corrections:
        columns |= correction_columns(spec, arm, seed, lag, columns[mn.REWARD_MEAN])
    if spec.tokens_per_step > 0:
        cost = 1 + 0.25 * list(spec.skill).index(arm)
        tokens_rng = np.random.default_rng(zlib.crc32(f"tokens/{arm}/{seed}/{lag}".encode()))
        columns[mn.TOKENS_GENERATED] = np.round(
            spec.tokens_per_step * cost * tokens_rng.uniform(0.9, 1.1, len(steps))
        )
    return pa.table(
        {
            k: pa.array(v, pa.float64()) if isinstance(v, np.ndarray) else v
            for k, v in columns.items()
        }
    )


def evals_table(spec: SyntheticSpec, metrics: pa.Table) -> pa.Table:
    """One row per (eval step, eval set), consistent with the step table's eval/pass_rate."""
    steps = metrics[mn.STEP].to_numpy()
    primary = metrics[mn.EVAL_PASS_RATE].to_numpy(zero_copy_only=False)
    rows: dict[str, list] = {ev.STEP: [], ev.EVAL_SET: [], ev.N_PROMPTS: [], ev.SAMPLES: []}
    scores: dict[str, list] = {ev.GREEDY_PASS_RATE: [], ev.PASS1_SAMPLED: []}
    scores |= {ev.pass_at_column(k): [] for k in spec.pass_at}
    samples = max(spec.pass_at)
    for step, rate in zip(steps, primary, strict=True):
        if not np.isfinite(rate):
            continue
        for j, name in enumerate(spec.eval_sets):
            greedy = float(np.clip(rate - 0.1 * j, 0, 1))
            pass1 = float(np.clip(greedy - 0.05, 0, 1))
            rows[ev.STEP].append(int(step))
            rows[ev.EVAL_SET].append(name)
            rows[ev.N_PROMPTS].append(32)
            rows[ev.SAMPLES].append(samples)
            scores[ev.GREEDY_PASS_RATE].append(greedy)
            scores[ev.PASS1_SAMPLED].append(pass1)
            for k in spec.pass_at:  # k independent draws at pass@1 (a smooth stand-in)
                scores[ev.pass_at_column(k)].append(1 - (1 - pass1) ** k)
    types = {ev.STEP: pa.int64(), ev.EVAL_SET: pa.string(), ev.N_PROMPTS: pa.int64()}
    types[ev.SAMPLES] = pa.int64()
    table = {k: pa.array(v, types[k]) for k, v in rows.items()}
    return pa.table(table | {k: pa.array(v, pa.float64()) for k, v in scores.items()})


def rollouts_parts(spec: SyntheticSpec, arm: str, seed: int, lag: int, last_step: int):
    """{step: its rollout log part} of one trial: the prompts of a step are matched across arms
    (drawn from seed and step), the responses drawn per arm (module docstring's effects)."""
    rng = np.random.default_rng(zlib.crc32(f"rollouts/{arm}/{seed}/{lag}".encode()))
    steps = np.arange(1, last_step + 1)
    rates = _pass_rate(spec, arm, seed, lag, steps.astype(float), rng=rng)
    parts = {}
    for step, rate in zip(steps, rates, strict=True):
        if not rl.is_logged_step(int(step), spec.eval_every, last_step):
            continue
        prompts = np.random.default_rng(zlib.crc32(f"prompts/{seed}/{step}".encode()))
        columns: dict[str, list] = {name: [] for name in rl.ROLLOUT_LOG_SCHEMA.names}
        for p in range(spec.rollout_groups):
            a, b = (int(x) for x in prompts.integers(10, 100, size=2))
            prompt = f"What is {a} + {b}?\nAnswer:"
            for sample in range(4):
                right = bool(rng.random() < rate)
                response = f"<answer>{a + b if right else a + b + 1}</answer>"
                version = max(0, int(step) - 1 - lag)
                values = {
                    rl.STEP: int(step),
                    rl.GROUP_ID: f"s{seed}-b{step - 1}-p{p}",
                    rl.PROMPT_INDEX: (int(step) - 1) * spec.rollout_groups + p,
                    rl.SAMPLE_INDEX: sample,
                    rl.POLICY_VERSION: version,
                    rl.LAG: int(step) - 1 - version,
                    rl.PROMPT_IDS: [ord(c) for c in prompt],
                    rl.RESPONSE_IDS: [ord(c) for c in response],
                    rl.PROMPT_TEXT: prompt,
                    rl.RESPONSE_TEXT: response,
                    rl.REWARD: float(right),
                    rl.FINISH_REASON: "stop",
                    rl.BEHAVIOR_LOGPROBS: [-0.5] * len(response),
                    rl.TOKEN_VERSIONS: [version] * len(response),
                }
                for name, value in values.items():
                    columns[name].append(value)
        parts[int(step)] = rl.rollout_table(columns)
    return parts


def write_trial(
    trial_dir: Path,
    info: dict,
    table: pa.Table,
    rows_per_part: int,
    evals: pa.Table | None = None,
) -> None:
    """trial.json plus the table split into parts of `rows_per_part` steps, each named by its
    first step (the learner's layout when 1), by the learner's writer; with `evals`, also
    evals.parquet (one part per eval step, exactly as the learner writes it)."""
    paths = TrialPaths(trial_dir)
    paths.metrics.mkdir(parents=True, exist_ok=True)
    paths.metadata.write_text(json.dumps(info, indent=2))
    steps = table[mn.STEP].to_numpy()
    for start in range(0, table.num_rows, rows_per_part):
        chunk = table.slice(start, rows_per_part)
        step_tables.write_part(paths.metrics, int(steps[start]), chunk)
    if evals is not None:
        paths.evals.mkdir(parents=True, exist_ok=True)
        eval_steps = evals[ev.STEP].to_numpy()
        for step in np.unique(eval_steps):
            part = evals.filter(pa.array(eval_steps == step))
            step_tables.write_part(paths.evals, int(step), part)


def resolved_config(spec: SyntheticSpec) -> str:
    """The part of a resolved config the report reads: each arm's objective and correction."""
    arms = [
        {"name": arm, "objective": arm, "correction": spec.arm_corrections.get(arm)}
        for arm in spec.skill
    ]
    return yaml.safe_dump({"name": spec.experiment, "arms": arms}, sort_keys=False)


def write_experiment(root: Path, spec: SyntheticSpec | None = None) -> Path:
    """Write every (arm, seed, lag) trial of `spec` under `root/trials`; returns `root`."""
    spec = spec or SyntheticSpec()
    diverged = {(a, s, lag): step for a, s, lag, step in spec.diverged}
    startup = {(a, s, lag): seconds for a, s, lag, seconds in spec.startup}
    for arm in spec.skill:
        for seed in spec.seeds:
            for lag in spec.lags:
                key = (arm, seed, lag)
                status = TrialStatus.FAILED if key in spec.failed else TrialStatus.COMPLETED
                status = TrialStatus.DIVERGED if key in diverged else status
                failed, diverges = status == TrialStatus.FAILED, status == TrialStatus.DIVERGED
                last = diverged.get(key, spec.steps // 2 if failed else spec.steps)
                name = f"{arm}-s{seed}-lag{lag}"
                info = {
                    "experiment": spec.experiment,
                    "trial_name": name,
                    "arm": arm,
                    "objective": arm,
                    "seed": seed,
                    "lag": lag,
                    "mode": spec.mode,
                    "status": status.value,
                    "diverged": diverges,
                    "diverged_reason": "non-finite grad norm" if diverges else None,
                    "steps_planned": spec.steps,
                    "started_at": STARTED_AT,
                    "regime": {
                        "mode": spec.mode,
                        "lag": lag,
                        "correction": spec.arm_corrections.get(arm) or "",
                    },
                }
                table = trial_table(spec, arm, seed, lag, last, startup=startup.get(key, 0.0))
                evals = evals_table(spec, table) if spec.eval_sets else None
                trial_dir = ExperimentPaths(root).trial(name).root
                write_trial(trial_dir, info, table, spec.rows_per_part, evals)
                if spec.arm_corrections:
                    TrialPaths(trial_dir).resolved_config.write_text(resolved_config(spec))
                if spec.rollouts:
                    for step, part in rollouts_parts(spec, arm, seed, lag, last).items():
                        step_tables.write_part(TrialPaths(trial_dir).rollouts, step, part)
    return root
