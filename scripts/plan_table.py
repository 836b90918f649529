"""The README's `harness plan` table: every model of configs/model_configs/ at 1 and 8 GPUs of
80 GB, bf16 FSDP and fp32 DDP, on `configs/gspo_vs_grpo_gpu.yaml` with
`learner.micro_batch_tokens=8192 learner.logprob_chunk_tokens=1024`.

Why a script: the table is the planner's output, so it is regenerated whenever the planner's
accounting changes (`python scripts/plan_table.py`, then paste the rows), never edited by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.config import load_config  # noqa: E402
from harness.planning.plan import Plan, Remedy, parse_size, plan_experiment  # noqa: E402
from harness.planning.render import LABELS, phase_words  # noqa: E402

GIB = 1024**3
MODELS = {
    "Qwen2.5-0.5B": "qwen2.5-0.5b.json",
    "Qwen2.5-1.5B": "qwen2.5-1.5b.json",
    "Qwen2.5-7B": "qwen2.5-7b.json",
    "Qwen3-30B-A3B": "qwen3-30b-a3b.json",
}
LEARNERS = {
    "bf16 FSDP": ("learner.parallel=fsdp", "learner.dtype=bfloat16"),
    "fp32 DDP": (),
}
COMMON = ("learner.micro_batch_tokens=8192", "learner.logprob_chunk_tokens=1024")
GPU_MEMORY, HEADROOM = "80GB", 0.1


def _gib(value: float) -> str:
    return f"{value / GIB:.2f}"


def _remedy(fix: Remedy, all_of: bool) -> str:
    host = f"; host {_gib(fix.estimate.host)}/rank" if fix.estimate.host else ""
    words = "all of " if all_of else ""
    return f"{words}`{' '.join(fix.overrides)}` ({_gib(fix.peak)}{host})"


def _phase(estimate, phase: str) -> str:
    """`update` or `scoring` as the table names the peak phase."""
    return phase_words(estimate, phase).split(" (")[0].removeprefix("the ")


def row(model: str, gpus: int, learner: str, plan: Plan) -> str:
    estimate = plan.chosen.estimate
    scoring = _gib(estimate.scoring.total)
    if estimate.scoring_pass != "micro":
        scoring += " (MoE pi_old)" if estimate.scoring_pass == "moe_pi_old" else " (MoE routing)"
    phase = estimate.peak_phase
    component, largest = getattr(estimate, phase).largest()
    label = LABELS[component].split(" (")[0]
    if plan.fits:
        verdict = f"fits: {_phase(estimate, phase)} {label}, {_gib(largest)}"
        advice = ""
    else:
        verdict = f"does not fit: {label}, {_gib(largest)}"
        if plan.remedies:
            advice = "; ".join(_remedy(fix, all_of=False) for fix in plan.remedies)
        elif plan.combined is not None:
            advice = _remedy(plan.combined, all_of=True)
        else:
            advice = ""
    cells = [model, str(gpus), learner, _gib(estimate.update.total), scoring, verdict, advice]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    header = ["model", "GPUs", "learner", "update", "scoring", "verdict: biggest part"]
    print("| " + " | ".join([*header, "`harness plan` suggests"]) + " |")
    print("|---|---:|---|---:|---:|---|---|")
    for model, file in MODELS.items():
        for gpus in (1, 8):
            for learner, overrides in LEARNERS.items():
                cfg = load_config(REPO / "configs/gspo_vs_grpo_gpu.yaml", [*COMMON, *overrides])
                plan = plan_experiment(
                    cfg,
                    gpus=gpus,
                    gpu_memory=parse_size(GPU_MEMORY, "--gpu-memory"),
                    headroom=HEADROOM,
                    model_config=REPO / "configs/model_configs" / file,
                )
                print(row(model, gpus, learner, plan))


if __name__ == "__main__":
    main()
