"""Learner throughput: tokens/s and model FLOPs utilisation of one update on the learner's path.

Each update is what `learner.runtime.step` does per minibatch: the policy forward through
`learner.runtime.forward.policy_logprobs` (log_softmax + gather + entropy over the real vocabulary),
the GSPO loss of `learner.algorithms.objectives`, backward, gradient clipping and an AdamW step. The
model is a random-init Qwen2 built here with a 32k vocabulary (nothing is downloaded), so the LM
head costs what a real model's does.

MFU follows the PaLM appendix: model FLOPs per token = 6 N + 12 L d T (N parameters without the
input embedding, L layers, d hidden size, T sequence length), times tokens per second, over the
device's peak dense bf16 FLOPs (a table of common GPUs, or `--peak-tflops`). On CPU there is no
meaningful peak, so MFU is reported as null.

    python benchmarks/learner_bench.py --quick                       # CPU, small model
    python benchmarks/learner_bench.py --device cuda --dtype bfloat16 # GPU (scripts/gpu_check.sh)

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learner.algorithms.advantages import group_advantages
from learner.algorithms.objectives import POLICY_LOSSES, PolicyBatch, reduce_loss
from learner.config import make_arm
from learner.runtime.forward import policy_logprobs

# Peak dense bf16 tensor FLOPs (no sparsity), from the vendors' data sheets.
PEAK_BF16_TFLOPS = {
    "H200": 989.4,
    "H100 SXM": 989.4,
    "H100 PCIe": 756.0,
    "H100": 989.4,
    "A100": 312.0,
    "L40S": 362.1,
    "A10G": 70.0,
    "L4": 121.0,
}


def peak_tflops(device_name: str) -> float | None:
    """The table's entry whose key occurs in the CUDA device name (longest match first)."""
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return PEAK_BF16_TFLOPS[key]
    return None


def build_model(args: argparse.Namespace, max_positions: int) -> Qwen2ForCausalLM:
    """A random-init Qwen2 of `--vocab`, `--hidden`, `--layers` with an untied head (as Qwen2.5
    from 3B up); shared with learner_memory_bench, so both measure the same model."""
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 256),
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def flops_per_token(model: Qwen2ForCausalLM, seq_len: int) -> float:
    """6 N + 12 L d T, N without the input embedding (a lookup, not a matmul)."""
    config = model.config
    n = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    return 6.0 * n + 12.0 * config.num_hidden_layers * config.hidden_size * seq_len


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="bfloat16: autocast of the forward (weights and AdamW in fp32)",
    )
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=16, help="sequences per update")
    parser.add_argument("--seq-len", type=int, default=1024, help="prompt + response tokens")
    parser.add_argument("--updates", type=int, default=10, help="timed updates (after 2 warm-up)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the table")
    parser.add_argument("--quick", action="store_true", help="small model and batch (CPU)")
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.batch, args.seq_len, args.updates = 128, 2, 4, 128, 3
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("learner_bench: --device cuda but torch sees no CUDA device; refusing to run")
    device = torch.device(args.device)

    model = build_model(args, args.seq_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    gspo_loss, gspo_arm = POLICY_LOSSES["gspo"], make_arm(name="gspo", objective="gspo")
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, args.vocab, (args.batch, args.seq_len), generator=gen)
    attention = torch.ones_like(input_ids)
    mask = torch.zeros(args.batch, args.seq_len, dtype=torch.bool)
    mask[:, args.seq_len // 4 :] = True  # a quarter prompt, the rest response
    rewards = torch.randint(0, 2, (args.batch,), generator=gen).float()
    group = 8 if args.batch % 8 == 0 else 1
    tensors = [t.to(device) for t in (input_ids, attention, mask, rewards)]
    input_ids, attention, mask, rewards = tensors
    advantages = group_advantages(rewards, group)
    with torch.no_grad():
        old, _ = policy_logprobs(model, input_ids, attention)

    autocast = (
        torch.autocast(device_type=args.device, dtype=torch.bfloat16)
        if args.dtype == "bfloat16"
        else contextlib.nullcontext()
    )

    def update() -> None:
        with autocast:
            logprobs, _ = policy_logprobs(model, input_ids, attention)
        batch = PolicyBatch.of(logprobs.float(), old, advantages, mask)
        reduce_loss(gspo_loss(batch, gspo_arm).loss, batch.lengths).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    for _ in range(2):
        update()
    sync()
    seconds = []
    for _ in range(args.updates):
        started = time.perf_counter()
        update()
        sync()
        seconds.append(time.perf_counter() - started)
    step_s = statistics.median(seconds)
    tokens_per_s = args.batch * args.seq_len / step_s
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    peak = args.peak_tflops or (peak_tflops(device_name) if args.device == "cuda" else None)
    model_flops = flops_per_token(model, args.seq_len) * tokens_per_s
    result = {
        "benchmark": "learner_bench",
        "device": device_name,
        "dtype": args.dtype,
        "params": sum(p.numel() for p in model.parameters()),
        "batch": args.batch,
        "seq_len": args.seq_len,
        "update_s": round(step_s, 4),
        "tokens_per_s": round(tokens_per_s, 1),
        "model_tflops_per_s": round(model_flops / 1e12, 3),
        "peak_tflops": peak,
        "mfu": None if peak is None else round(model_flops / (peak * 1e12), 4),
    }
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
