"""`harness plan`'s output: a few lines on what was planned, the table, the verdict."""

from __future__ import annotations

from dataclasses import fields

from rich.table import Table

from harness.planning.memory import MemoryEstimate, Phase
from harness.planning.plan import Plan, Remedy
from harness.planning.routing import routes_recorded

LABELS = {
    "parameters": "parameters (float32)",
    "gradients": "gradients (float32)",
    "optimizer": "AdamW moments (float32)",
    "gathered": "FSDP gathered units",
    "activations": "activations",
    "logits": "logits + log-prob copies",
    "routing": "MoE routing (one micro-batch)",
    "step": "AdamW step temporaries",
}
OPTIONAL_ROWS = ("gathered", "routing", "step")  # shown when not 0
SCORING_PASSES = {  # MemoryEstimate.scoring_pass: (table column, the verdict's words)
    "micro": (
        "scoring",
        "the scoring forwards (pi_old, reference, old values: no grad, every row on every rank)",
    ),
    "moe_pi_old": (
        "scoring: MoE pi_old",
        "MoE pi_old's forward (no grad, every row on every rank, routing captured)",
    ),
    "moe_routing": (
        "scoring: MoE routing",
        "the moe/* forwards (no grad, every row on every rank, routing captured, then replayed)",
    ),
}
UPDATE_MOMENTS = {  # MemoryEstimate.update_moment: (table column, the verdict's words)
    "backward": ("update", "the update (a block's backward in a micro-batch)"),
    "log_probs": ("update: log-probs", "the update (a micro-batch's log-probs and their backward)"),
    "optimizer_step": ("update: AdamW step", "the update (AdamW's step)"),
}


def phase_words(estimate: MemoryEstimate, phase: str) -> str:
    """How the verdict names a phase: the update's moment, or the no-grad pass of the scoring
    column."""
    if phase == "update":
        return UPDATE_MOMENTS[estimate.update_moment][1]
    return SCORING_PASSES[estimate.scoring_pass][1]


GIB, MIB = 2**30, 2**20


def unit_of(plan: Plan) -> tuple[str, int]:
    """GiB, or MiB for a step under 1 GiB (the built-in model's)."""
    return ("GiB", GIB) if plan.chosen.estimate.peak >= GIB else ("MiB", MIB)


def size(value: float) -> str:
    """`value` bytes in GiB, or in MiB under 1 GiB, with the unit's name."""
    name, scale = ("GiB", GIB) if value >= GIB else ("MiB", MIB)
    return f"{value / scale:,.2f} {name}"


def number(value: float, unit: tuple[str, int]) -> str:
    return f"{value / unit[1]:,.2f}"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def describe(plan: Plan, gpu_memory_text: str) -> list[str]:
    """The lines above the table: model, learner, batch and arm."""
    shape, setup, arm = plan.shape, plan.chosen.setup, plan.chosen
    kind = "dense"
    if shape.moe is not None:
        kind = (
            f"MoE, {shape.moe.experts} experts, {shape.moe.active} active "
            f"({_count(shape.active_parameters())} active parameters)"
        )
    model = (
        f"model: {shape.name} ({plan.source}): {_count(shape.parameters())} parameters, "
        f"{kind}, vocabulary {shape.vocab:,}"
    )
    learner = (
        f"learner: {setup.gpus} GPU(s) of {gpu_memory_text}, {setup.parallel}, {setup.dtype}, "
        f"activation checkpointing {'on' if setup.activation_checkpointing else 'off'}, "
        f"cpu offload {'on' if setup.cpu_offload else 'off'}, AdamW {setup.optimizer_impl}"
    )
    chunk = setup.logprob_chunk_tokens
    moe = " (MoE pi_old and moe/* routing too)" if routes_recorded(shape) else ""
    batch = (
        f"batch: {setup.step_rows} rows ({setup.groups} prompts x {setup.group_size}) of up to "
        f"{setup.seq_len} tokens in {setup.minibatches} minibatch(es); each rank's update "
        f"micro-batch {setup.micro_rows} rows ({setup.micro_rows * setup.seq_len:,} tokens), "
        f"no-grad micro-batch {setup.scoring_rows} rows of all {setup.step_rows}{moe}; "
        + (f"log-probs in chunks of {chunk} positions" if chunk else "log-probs unchunked")
    )
    extras = [name for name, on in (("critic", setup.critic), ("reference", setup.reference)) if on]
    names = ", ".join(a.arm for a in plan.arms)
    arm_line = (
        f"arm: {arm.arm} ({' and '.join(extras) if extras else 'no critic, no reference'}), "
        f"the most demanding of: {names}"
    )
    return [model, learner, batch, arm_line]


def table(plan: Plan) -> Table:
    """Per-GPU memory by component at the two peaks of a step."""
    estimate, unit = plan.chosen.estimate, unit_of(plan)
    out = Table(title=f"memory per GPU ({unit[0]})", title_justify="left")
    out.add_column("component")
    out.add_column(UPDATE_MOMENTS[estimate.update_moment][0], justify="right")
    out.add_column(SCORING_PASSES[estimate.scoring_pass][0], justify="right")
    for f in fields(Phase):
        update, scoring = getattr(estimate.update, f.name), getattr(estimate.scoring, f.name)
        if update == 0 and scoring == 0 and f.name in OPTIONAL_ROWS:
            continue  # not part of this setup
        out.add_row(LABELS[f.name], number(update, unit), number(scoring, unit))
    totals = (number(estimate.update.total, unit), number(estimate.scoring.total, unit))
    out.add_row("total", *totals, style="bold")
    return out


def verdict(plan: Plan, gpu_memory_text: str, headroom: float) -> list[str]:
    """'fits' or 'does not fit', the biggest contributor, what to change, and host memory."""
    estimate = plan.chosen.estimate
    phase = estimate.peak_phase
    usable = f"{size(plan.budget)} usable ({gpu_memory_text} less {headroom:.0%} headroom)"
    component, largest = getattr(estimate, phase).largest()
    biggest = f"biggest: {LABELS[component]} in {phase_words(estimate, phase)}, {size(largest)}"
    peak = size(estimate.peak)
    if plan.fits:
        lines = [f"fits: peak {peak} per GPU of {usable}; {biggest}"]
    else:
        lines = [f"does not fit: peak {peak} per GPU > {usable}; {biggest}", *_advice(plan)]
    if estimate.host:
        gpus = plan.chosen.setup.gpus
        lines.append(
            f"host memory (cpu_offload): {size(estimate.host)} per rank, "
            f"{size(estimate.host * gpus)} for {gpus} rank(s)"
        )
    return lines


def _advice(plan: Plan) -> list[str]:
    if plan.remedies:
        return ["to fit, set one of:"] + [f"  {_remedy(fix)}" for fix in plan.remedies]
    fix = plan.combined
    if fix is not None and fix.peak <= plan.budget:
        return [f"to fit, set all of: {_remedy(fix)}"]
    lines = []
    if fix is not None:
        lines.append(
            f"no learner option makes it fit: with all of {' '.join(fix.overrides)} the peak "
            f"is {size(fix.peak)}"
        )
    remaining = plan.chosen.estimate if fix is None else fix.estimate
    return [*lines, _beyond_options(remaining)]


def _remedy(fix: Remedy) -> str:
    host = f"; host {size(fix.estimate.host)} per rank" if fix.estimate.host else ""
    return f"{' '.join(fix.overrides)}  (peak {size(fix.peak)}{host})"


def _beyond_options(estimate: MemoryEstimate) -> str:
    """The biggest part left when the learner options are not enough, and what else changes it."""
    phase = estimate.peak_phase
    component, largest = getattr(estimate, phase).largest()
    left = f"left biggest: {LABELS[component]} in {phase_words(estimate, phase)}, {size(largest)}"
    whole_batch = (
        "lower learner.prompts_per_step, generation.group_size or generation.max_new_tokens"
    )
    if component in ("parameters", "gradients", "optimizer"):
        return f"{left}; add GPUs (--gpus) under learner.parallel=fsdp"
    if component == "routing":
        return (
            f"{left}; MoE's routing on the device (experts and router entropy of every token "
            f"and sparse layer) is one no-grad micro-batch's: lower learner.micro_batch_tokens, "
            f"or {whole_batch}"
        )
    return f"{left}; lower generation.max_new_tokens (one row per micro-batch is the least)"
