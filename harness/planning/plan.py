"""From an experiment config to a verdict: the most demanding arm's estimate against a GPU.

`plan_experiment` reads what the estimate needs (`learner.*`, `generation.*`, each arm's
critic, reference and minibatch overrides), estimates every arm and keeps the largest, and
tries the learner options that lower the peak one at a time (`remedies`), so the verdict can
say which single change makes the step fit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from harness.overrides import ConfigError
from harness.planning.architecture import KNOWN_TYPES, ModelShape, load_shape, shape_from_hf_config
from harness.planning.memory import MemoryEstimate, estimate
from harness.planning.routing import expert_index_bytes, routes_recorded, routing_record
from harness.planning.setup import LearnerSetup

if TYPE_CHECKING:
    from harness.config import ExperimentConfig
    from learner.config import ArmBase

UNITS = {"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}
UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
DEFAULT_PROMPT_TOKENS = 256
"""Prompt length assumed for a user model (the task's prompts are not tokenised to plan)."""
SUGGESTED_CHUNK = 1024
Change = tuple[tuple[str, ...], dict[str, object]]  # (overrides, setup changes)


GPU_MEMORY_MIB = {
    "a100-40gb": 40_960,
    "a100-80gb": 81_920,
    "h100-80gb": 81_559,
    "h200": 143_771,
    "l40s": 46_068,
}
"""Memory a GPU reports (`nvidia-smi`, NVML's total), by product: "80 GB" on a datasheet is
about 80 GiB on the device (an H100's 81,559 MiB is 79.65 GiB), not 80 x 10^9 bytes (74.5
GiB), so `--gpu-memory H100-80GB` plans against what the device really has."""


def parse_size(text: str, option: str) -> float:
    """Bytes of `80GB` (10^9), `80GiB` (2^30), `81920MiB`, ..., or of a GPU by name
    (`GPU_MEMORY_MIB`: `H100-80GB`); a one-line error otherwise."""
    named = GPU_MEMORY_MIB.get(text.strip().lower())
    if named is not None:
        return float(named) * UNITS["mib"]
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?b)\s*", text, re.IGNORECASE)
    if match is None or float(match.group(1)) <= 0:
        gpus = ", ".join(name.upper() for name in GPU_MEMORY_MIB)
        raise ConfigError(
            f"{option} {text!r} is not a positive size with a unit, e.g. 80GB or 80GiB "
            f"(GB = 10^9 bytes, GiB = 2^30; also MB, MiB, TB, TiB), or a GPU: {gpus}"
        )
    return float(match.group(1)) * UNITS[match.group(2).lower()]


@dataclass(frozen=True)
class ArmPlan:
    arm: str
    setup: LearnerSetup
    estimate: MemoryEstimate


@dataclass(frozen=True)
class Remedy:
    """Overrides that change the setup, and the estimate with them."""

    overrides: tuple[str, ...]
    estimate: MemoryEstimate

    @property
    def peak(self) -> float:
        return self.estimate.peak


@dataclass(frozen=True)
class Plan:
    shape: ModelShape
    source: str  # where the shape came from
    arms: list[ArmPlan]
    chosen: ArmPlan  # the arm with the largest peak
    budget: float  # usable bytes per GPU
    remedies: list[Remedy]  # the single changes that make it fit
    combined: Remedy | None = None  # when none does: every change at once (may still not fit)
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.chosen.estimate.peak <= self.budget


def builtin_shape(cfg: ExperimentConfig) -> ModelShape:
    """The shape of the config the harness builds for `model.path: builtin` (no weights)."""
    from harness.models.factory import ARCHITECTURES, TOKENIZERS, special_ids

    build_tokenizer, _ = TOKENIZERS[cfg.model.tokenizer]
    tokenizer = build_tokenizer(cfg.model.max_seq_len)
    make_config, _ = ARCHITECTURES[cfg.model.arch]
    hf_config = make_config(cfg.model, len(tokenizer), special_ids(tokenizer))
    return shape_from_hf_config(hf_config.to_dict(), f"builtin {cfg.model.arch}", "builtin model")


def model_shape(cfg: ExperimentConfig, model_config: Path | None) -> tuple[ModelShape, str]:
    """(shape, its source): --model-config, the built-in model, or model.path's config.json."""
    if model_config is not None:
        shape = load_shape(model_config)
        return shape, str(model_config)
    if cfg.model.path == "builtin":
        return builtin_shape(cfg), "model.path=builtin"
    path = Path(cfg.model.path).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model.path {path} has no config.json; pass --model-config PATH (a config.json) "
            "to plan for a model that is not downloaded"
        )
    return load_shape(path), str(path / "config.json")


def default_prompt_tokens(cfg: ExperimentConfig) -> int:
    """The built-in model's context less the response (its prompts fit there), else 256."""
    if cfg.model.path == "builtin":
        return max(1, cfg.model.max_seq_len - cfg.generation.max_new_tokens)
    return DEFAULT_PROMPT_TOKENS


def setup_for(cfg: ExperimentConfig, arm: ArmBase, gpus: int, prompt_tokens: int) -> LearnerSetup:
    """The learner setup of `arm` (its minibatch and epoch overrides applied)."""
    learner, gen = arm.training_settings(cfg.learner), cfg.generation
    return LearnerSetup(
        gpus=gpus,
        parallel=learner.parallel,
        dtype=learner.dtype,
        activation_checkpointing=learner.activation_checkpointing,
        cpu_offload=learner.cpu_offload,
        groups=learner.prompts_per_step,
        group_size=gen.group_size,
        minibatches=learner.minibatches,
        seq_len=prompt_tokens + gen.max_new_tokens,
        micro_batch_tokens=learner.micro_batch_tokens,
        logprob_chunk_tokens=learner.logprob_chunk_tokens,
        critic=arm.needs_value_model,
        reference=arm.beta > 0,
        truncated_sampling=gen.top_p < 1 or gen.top_k > 0,
        optimizer_impl=learner.resolved_optimizer_impl,
    )


def _largest_micro_batch(shape: ModelShape, setup: LearnerSetup, budget: float) -> int | None:
    """The largest learner.micro_batch_tokens (whole rows) that fits, if smaller than now: the
    budget splits the update's share and the no-grad passes' whole batch, so the search starts
    below the larger of the two micro-batches."""
    for rows in range(max(setup.micro_rows, setup.scoring_rows) - 1, 0, -1):
        tokens = rows * setup.seq_len
        if estimate(shape, replace(setup, micro_batch_tokens=tokens)).peak <= budget:
            return tokens
    return None


def _candidates(setup: LearnerSetup) -> list[Change]:
    """(overrides, setup changes) of each learner option that can lower the peak."""
    found: list[Change] = []
    if setup.parallel == "ddp" and setup.gpus > 1:
        found.append((("learner.parallel=fsdp",), {"parallel": "fsdp"}))
    if setup.dtype == "float32":
        both = ("learner.parallel=fsdp", "learner.dtype=bfloat16")
        found.append(
            (
                both[1:] if setup.parallel == "fsdp" else both,
                {"parallel": "fsdp", "dtype": "bfloat16"},
            )
        )
    if not setup.activation_checkpointing:
        found.append(
            (("learner.activation_checkpointing=true",), {"activation_checkpointing": True})
        )
    chunk = setup.logprob_chunk_tokens
    if chunk is None or chunk > SUGGESTED_CHUNK:
        override = f"learner.logprob_chunk_tokens={SUGGESTED_CHUNK}"
        found.append(((override,), {"logprob_chunk_tokens": SUGGESTED_CHUNK}))
    if setup.optimizer_impl != "fused" and not setup.cpu_offload:
        found.append((("learner.optimizer_impl=fused",), {"optimizer_impl": "fused"}))
    if setup.parallel == "fsdp" and not setup.cpu_offload:
        found.append((("learner.cpu_offload=true",), {"cpu_offload": True}))
    return found


def remedies(shape: ModelShape, setup: LearnerSetup, budget: float) -> list[Remedy]:
    """Each single learner change that makes the step fit."""
    fitting = []
    for overrides, changes in _candidates(setup):
        changed = estimate(shape, replace(setup, **changes))
        if changed.peak <= budget:
            fitting.append(Remedy(overrides, changed))
    micro = _largest_micro_batch(shape, setup, budget)
    if micro is not None:
        tokens = (f"learner.micro_batch_tokens={micro}",)
        fitting.append(Remedy(tokens, estimate(shape, replace(setup, micro_batch_tokens=micro))))
    return fitting


def _apply(setup: LearnerSetup, changes: list[Change]) -> LearnerSetup:
    for _, change in changes:
        setup = replace(setup, **change)
    return setup


def _valid(setup: LearnerSetup) -> bool:
    """What LearnerConfig accepts: bf16 and CPU offload need FSDP."""
    return setup.parallel == "fsdp" or (setup.dtype == "float32" and not setup.cpu_offload)


def combined_remedy(shape: ModelShape, setup: LearnerSetup, budget: float) -> Remedy | None:
    """The learner changes together (None: no change is left to make): every one, with the
    largest micro-batch that then fits, less those the step fits without (last first). The
    peak may still be over the budget."""
    changes: list[Change] = []
    while candidates := _candidates(_apply(setup, changes)):  # FSDP opens cpu_offload
        changes += candidates
    if estimate(shape, _apply(setup, changes)).peak > budget:
        micro = _largest_micro_batch(shape, _apply(setup, changes), budget)
        if micro is not None:
            changes.append(
                ((f"learner.micro_batch_tokens={micro}",), {"micro_batch_tokens": micro})
            )
    if not changes:
        return None
    if estimate(shape, _apply(setup, changes)).peak <= budget:
        for change in reversed(list(changes)):
            rest = [kept for kept in changes if kept is not change]
            trial = _apply(setup, rest)
            if _valid(trial) and estimate(shape, trial).peak <= budget:
                changes = rest
    overrides: list[str] = []
    for names, _ in changes:
        overrides += [name for name in names if name not in overrides]
    return Remedy(tuple(overrides), estimate(shape, _apply(setup, changes)))


def _notes(
    cfg: ExperimentConfig, shape: ModelShape, setup: LearnerSetup, prompt_note: str | None
) -> list[str]:
    from learner.config import group_split_problem

    notes = [prompt_note] if prompt_note else []
    problem = group_split_problem(setup.groups, setup.minibatches, setup.gpus)
    if problem is not None:
        notes.append(f"the learner would refuse this: {problem}")
    if shape.model_type not in KNOWN_TYPES:
        notes.append(
            f"model_type {shape.model_type!r} is counted as a Llama-style decoder; its "
            "parameter count may differ"
        )
    if routes_recorded(shape):
        assert shape.moe is not None
        record = routing_record(shape, setup) / 2**30
        index = f"{8 * expert_index_bytes(shape.moe.experts)}-bit"
        notes.append(
            f"MoE: pi_old's forward (routing capture) and the moe/* routing forward run in the "
            f"no-grad micro-batches; pi_old's record of the batch's routing, {record:.2f} GiB "
            f"({index} experts and a float32 router entropy a token and sparse layer, no router "
            f"logits), waits in host memory through the updates, and the device holds one "
            f"micro-batch's capture or slice of it at a time"
        )
    gen = cfg.generation
    if gen.backend == "vllm" and gen.device == "cuda":
        notes.append(
            f"vLLM generators on the same GPUs take generation.gpu_memory_utilization="
            f"{gen.gpu_memory_utilization} of each: then give --gpu-memory as what they leave"
        )
    if cfg.learner.device == "cpu":
        notes.append("learner.device=cpu: the estimate is of each learner process's host memory")
    return notes


def plan_experiment(
    cfg: ExperimentConfig,
    *,
    gpus: int,
    gpu_memory: float,
    headroom: float,
    model_config: Path | None = None,
    prompt_tokens: int | None = None,
) -> Plan:
    """Estimate every arm on `gpus` ranks of `gpu_memory` bytes, keeping `headroom` (a
    fraction) free for the CUDA context, NCCL and allocator fragmentation."""
    shape, source = model_shape(cfg, model_config)
    prompt_note = None
    if prompt_tokens is None:
        prompt_tokens = default_prompt_tokens(cfg)
        where = (
            "model.max_seq_len less max_new_tokens" if cfg.model.path == "builtin" else "assumed"
        )
        prompt_note = f"prompts of {prompt_tokens} tokens ({where}; set --prompt-tokens)"
    arms = []
    for arm in cfg.arms:
        setup = setup_for(cfg, arm, gpus, prompt_tokens)
        arms.append(ArmPlan(arm.name, setup, estimate(shape, setup)))
    chosen = max(arms, key=lambda plan: plan.estimate.peak)  # the first of equals
    budget = gpu_memory * (1 - headroom)
    fits = chosen.estimate.peak <= budget
    fixes = [] if fits else remedies(shape, chosen.setup, budget)
    combined = None if fits or fixes else combined_remedy(shape, chosen.setup, budget)
    notes = _notes(cfg, shape, chosen.setup, prompt_note)
    return Plan(shape, source, arms, chosen, budget, fixes, combined, notes)
