"""Check the GPU check's trial (scripts/gpu_check.sh) and print its figures as one JSON object.

Fails (exit 1, the reason on stderr) unless every trial of the experiment completed all its
steps, its loss and reward are finite at every step, and the trial ran where it was told to: the
recorded hardware has a CUDA device. The figures: steps, final greedy pass rate, the
bf16-engine-vs-fp32-learner gap (`mismatch/kl_behavior`), learner step time, the learner's wait
share and generation throughput.

    python scripts/gpu_check_trial.py <experiment dir>
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contract import metrics as M
from contract import step_tables
from contract.layout import TrialPaths
from contract.record import read_trial_record
from contract.trial import TrialStatus

MUST_BE_FINITE = (M.POLICY_LOSS, M.REWARD_MEAN, M.OPTIM_GRAD_NORM)


def check_trial(trial_dir: Path) -> dict[str, object]:
    record = read_trial_record(trial_dir)
    if record is None:
        raise SystemExit(f"{trial_dir}: no trial.json")
    if record.status != TrialStatus.COMPLETED:
        raise SystemExit(f"{trial_dir}: status {record.status}: {record.failure_reason}")
    table = step_tables.read_steps(TrialPaths(trial_dir).metrics).table
    if table is None:
        raise SystemExit(f"{trial_dir}: no metrics parts")
    rows = table.to_pylist()  # sorted by step
    rows = [r for r in rows if r[M.STEP] >= 1]  # step 0 holds the initial eval alone
    if len(rows) != record.steps_planned:
        raise SystemExit(f"{trial_dir}: {len(rows)} metric rows for {record.steps_planned} steps")
    for row in rows:
        bad = [name for name in MUST_BE_FINITE if not math.isfinite(row[name])]
        if bad:
            raise SystemExit(f"{trial_dir}: step {row[M.STEP]}: non-finite {bad}")
    # Checked last, so a trial moved to the CPU fails for its device alone (tests rely on it).
    hardware = (record.provenance or {}).get("hardware", {})
    if not hardware.get("cuda_available"):
        raise SystemExit(f"{trial_dir}: trial.json records no CUDA device: {hardware}")

    def mean(name: str) -> float | None:
        values = [r[name] for r in rows if r[name] is not None and math.isfinite(r[name])]
        return round(sum(values) / len(values), 6) if values else None

    evals = [r[M.EVAL_PASS_RATE] for r in rows if math.isfinite(r[M.EVAL_PASS_RATE])]
    return {
        "trial": trial_dir.name,
        "gpus": hardware.get("gpus"),
        "steps": len(rows),
        "final_pass_rate": evals[-1] if evals else None,
        "reward_mean_last": rows[-1][M.REWARD_MEAN],
        "engine_kl_bf16_vs_fp32": mean(M.MISMATCH_KL_BEHAVIOR),
        "learner_step_s": mean(M.PERF_LEARNER_STEP_S),
        "learner_wait_frac": mean(M.PERF_LEARNER_WAIT_FRAC),
        "gen_tokens_per_s": mean(M.PERF_GEN_TOKENS_PER_S),
    }


def main() -> None:
    root = Path(sys.argv[1])
    trial_dirs = sorted(p.parent for p in (root / "trials").glob("*/trial.json"))
    if not trial_dirs:
        raise SystemExit(f"{root}: no trials")
    print(json.dumps({"trials": [check_trial(d) for d in trial_dirs]}))


if __name__ == "__main__":
    main()
