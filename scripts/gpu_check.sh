#!/usr/bin/env bash
# The prepared GPU check (issue 16), for a machine with one NVIDIA GPU:
#   1. setup (scripts/setup.sh picks the `gpu` extra: vLLM with CUDA);
#   2. a short fixed-mode trial of configs/gpu_check.yaml: the built-in model, vLLM on CUDA in
#      bfloat16, the learner on CUDA; checked for completion, finite metrics and the device used;
#   3. benchmarks/generation_bench.py --device cuda: the harness's vLLM generator vs bare vLLM;
#   4. benchmarks/learner_bench.py --device cuda --dtype bfloat16: tokens/s and MFU;
#   with 2+ GPUs, also a 6-step FSDP trial (2 learner ranks, bf16 mixed precision) checked
#   like the first (skipped, and said so in the JSON, on one GPU);
#   5. `harness plan` of the GSPO paper's setting (Qwen3-30B-A3B on 8 x 80 GB, issue 40),
#      printed as a table to stderr, so the check's log records that estimate (no GPU needed);
#   6. benchmarks/learner_memory_bench.py at that model's width (4 of its layers, random init,
#      the paper's learner options, one rank): measured peak per phase against the plan.
# Prints one JSON line (the last line) and exits 0 only if every part passed. It never falls back
# to the CPU: without a visible GPU, or with a CPU build of torch, it stops at once, non-zero.
# Budget: 9 minutes on one H200 after the packages are downloaded; each stage has its own limit.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { printf 'gpu_check: FAILED: %s\n' "$*" >&2; exit 1; }
stage() { printf '\033[1m[gpu_check]\033[0m %s\n' "$*" >&2; }
started=$(date +%s)

command -v nvidia-smi >/dev/null 2>&1 \
  || fail "nvidia-smi not found: this check needs an NVIDIA GPU and refuses to fall back to the CPU"
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' \
  || fail "nvidia-smi lists no GPU: this check refuses to fall back to the CPU"

stage "setup"
timeout 900 bash scripts/setup.sh >&2 || fail "scripts/setup.sh failed"
grep -q 'gpu' .venv/.gspo-harness-installed \
  || fail "setup did not install the gpu extra (see .venv/.gspo-harness-installed)"
.venv/bin/python -c '
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device (a CPU build?)")
' || fail "torch cannot use the GPU"

work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-XXXXXX")"
stage "trial (configs/gpu_check.yaml) -> $work/run"
timeout 300 .venv/bin/harness run configs/gpu_check.yaml --out "$work/run" >"$work/trial.log" 2>&1 \
  || { tail -n 40 "$work/trial.log" >&2; fail "the GPU trial failed (log: $work/trial.log)"; }
.venv/bin/python scripts/gpu_check_trial.py "$work/run" >"$work/trial.json" \
  || fail "the GPU trial's output is wrong (see above)"

gpus=$(nvidia-smi -L | grep -c '^GPU ')
if [ "$gpus" -ge 2 ]; then
  stage "FSDP trial: 2 learner ranks, bf16 mixed precision -> $work/fsdp"
  timeout 300 .venv/bin/harness run configs/gpu_check.yaml --out "$work/fsdp" \
    learner.parallel=fsdp learner.dtype=bfloat16 executor.learner_ranks=2 \
    learner.steps=6 learner.eval_every=3 learner.checkpoint_every=3 \
    >"$work/fsdp.log" 2>&1 \
    || { tail -n 40 "$work/fsdp.log" >&2; fail "the FSDP trial failed (log: $work/fsdp.log)"; }
  .venv/bin/python scripts/gpu_check_trial.py "$work/fsdp" >"$work/fsdp.json" \
    || fail "the FSDP trial's output is wrong (see above)"
else
  echo "{\"skipped\": \"$gpus GPU: the FSDP trial needs 2\"}" >"$work/fsdp.json"
fi

stage "generation benchmark: harness vLLM vs bare vLLM on CUDA"
timeout 240 .venv/bin/python benchmarks/generation_bench.py --device cuda --dtype bfloat16 \
  --prompts 64 --max-new-tokens 128 --repeats 3 >"$work/generation.log" 2>&1 \
  || { tail -n 40 "$work/generation.log" >&2; fail "generation_bench failed"; }
tail -n 1 "$work/generation.log" >"$work/generation.json"

stage "learner throughput (bf16 autocast)"
timeout 180 .venv/bin/python benchmarks/learner_bench.py --device cuda --dtype bfloat16 \
  >"$work/learner.log" 2>&1 || { tail -n 40 "$work/learner.log" >&2; fail "learner_bench failed"; }
tail -n 1 "$work/learner.log" >"$work/learner.json"

# The learner's memory per GPU for the GSPO paper's setting, Qwen3-30B-A3B on 8 x 80 GB with
# bf16 FSDP, activation checkpointing, chunked log-probs and micro-batches, without CPU offload
# (the evals run on the generators). A pure estimate from the model's config.json: no GPU, no
# weights; it exits 0 whether or not the step fits, and the verdict is in the table's log.
# Planned at 80 x 10^9 bytes and at what an H100 of 80 GB reports (81,559 MiB).
stage "memory plan: Qwen3-30B-A3B, 8 x 80 GB (harness plan, no GPU needed)"
for memory in 80GB H100-80GB; do
  timeout 60 .venv/bin/harness plan configs/gspo_vs_grpo_gpu.yaml \
    --model-config configs/model_configs/qwen3-30b-a3b.json --gpus 8 --gpu-memory "$memory" \
    learner.parallel=fsdp learner.dtype=bfloat16 learner.activation_checkpointing=true \
    learner.logprob_chunk_tokens=1024 learner.micro_batch_tokens=8192 >&2 \
    || fail "harness plan of Qwen3-30B-A3B at $memory failed"
done

stage "learner memory at Qwen3-30B-A3B's width: measured against harness plan"
timeout 240 .venv/bin/python benchmarks/learner_memory_bench.py --device cuda --world 1 \
  --model-config configs/model_configs/qwen3-30b-a3b.json --layers 4 --groups 4 --group-size 8 \
  --prompt-len 256 --response-len 1024 --micro-batch-tokens 8192 --logprob-chunk-tokens 1024 \
  --updates 1 --only fsdp_all_bf16 >"$work/moe_memory.log" 2>&1 \
  || { tail -n 40 "$work/moe_memory.log" >&2; fail "learner_memory_bench (MoE width) failed"; }
tail -n 1 "$work/moe_memory.log" >"$work/moe_memory.json"

elapsed=$(( $(date +%s) - started ))
.venv/bin/python - "$work" "$elapsed" <<'PY'
import json, sys
from pathlib import Path
work, elapsed = Path(sys.argv[1]), int(sys.argv[2])
names = ("trial", "fsdp", "generation", "learner", "moe_memory")
parts = {name: json.loads((work / f"{name}.json").read_text()) for name in names}
print(json.dumps({"gpu_check": "passed", "wall_s": elapsed, "workdir": str(work), **parts}))
PY
