"""Generation throughput: the vLLM backend vs the torch backend vs transformers' `generate`.

Same prompts, group size and length budget for all three, on random-init Qwen2 models built here
(a tiny built-in-like one, hidden 64 x 2 layers, and a ~10M-parameter one), plus the harness's
overhead over a bare `LLM.generate` on the same engine and requests, SamplingParams built
inside both timings (target: under 5%).
Tokens/s counts sampled tokens up to and including EOS. Each figure is the best of `--repeats`
timed runs after one warm-up run: the machine may be shared, and the fastest run is the one least
disturbed by other processes. Harness and bare vLLM runs alternate (3x `--repeats` pairs), so drift
hits both alike; `harness_overhead_pct` compares their best CPU times (process time, which time
spent descheduled by other processes does not inflate; exact with the default of one thread),
`harness_overhead_pct_wall` their best wall times. `vllm_startup_s` includes the first import of
vLLM (~15 s of it).

    python benchmarks/generation_bench.py --quick   # tiny model only, under a minute
    python benchmarks/generation_bench.py           # both models

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read when vLLM is imported

import torch
from transformers import Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from buffer.weight_store import read_state_dict
from harness.generators import GenRequest, SamplingSettings, sample_seed
from harness.generators.base import set_torch_threads
from harness.generators.torch_backend import TorchGenerator
from harness.models.tokenizer import EOS_ID, PAD_ID
from tests.tiny_models import TinyArch, save_tiny_model_dir

# Random-init Qwen2 models; head size (hidden / heads) >= 32, as vLLM's CPU attention needs.
SIZES = {
    "tiny": TinyArch(
        hidden=64, intermediate=256, layers=2, heads=2, max_positions=128, tie_embeddings=False
    ),
    "10m": TinyArch(
        hidden=256,
        intermediate=1024,
        layers=10,
        heads=4,
        kv_heads=2,
        max_positions=128,
        tie_embeddings=False,
    ),
}


def build_model(arch: TinyArch, path: Path) -> int:
    """Save a random-init model + char tokenizer to `path`; returns its parameter count."""
    save_tiny_model_dir(path, arch)
    return sum(t.numel() for t in read_state_dict(path).values())


def make_requests(prompts: int, group: int, max_new_tokens: int) -> list[GenRequest]:
    """Prompts of 6-13 character tokens (ids 4..50), one seed per sample."""
    return [
        GenRequest(
            prompt_ids=[4 + (7 * i + 3 * k) % 47 for k in range(6 + i % 8)],
            seeds=[sample_seed(0, 0, i, j) for j in range(group)],
            max_new_tokens=max_new_tokens,
        )
        for i in range(prompts)
    ]


def timed(run: Callable[[], int], repeats: int) -> tuple[float, int]:
    """(best seconds, tokens of the last run) over `repeats` runs after one warm-up."""
    run()
    seconds, tokens = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        tokens = run()
        seconds.append(time.perf_counter() - started)
    return min(seconds), tokens


def hf_generate_runner(model_dir: Path, requests: list[GenRequest]) -> Callable[[], int]:
    """transformers' sampling `generate` on the same rows (left-padded), top_k off as ours."""
    model = Qwen2ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    rows = [r.prompt_ids for r in requests for _ in r.seeds]
    width = max(len(ids) for ids in rows)
    input_ids = torch.tensor([[PAD_ID] * (width - len(ids)) + ids for ids in rows])  # (B, L)
    mask = (
        torch.arange(width)[None, :] >= torch.tensor([width - len(ids) for ids in rows])[:, None]
    ).long()
    budget = requests[0].max_new_tokens

    def run() -> int:
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=budget,
                eos_token_id=EOS_ID,
                pad_token_id=PAD_ID,
            )
        return sum(_length_to_eos(row) for row in out[:, width:].tolist())

    return run


def _length_to_eos(ids: list[int]) -> int:
    return ids.index(EOS_ID) + 1 if EOS_ID in ids else len(ids)


def bench_vllm(
    model_dir: Path,
    requests: list[GenRequest],
    threads: int,
    repeats: int,
    *,
    device: str = "cpu",
    dtype: str = "float32",
) -> dict:
    """Harness VLLMGenerator vs a bare LLM.generate with identical SamplingParams, interleaved."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from harness.generators.vllm_backend import VLLMGenerator

    started = time.perf_counter()
    generator = VLLMGenerator(
        model_dir,
        sampling=SamplingSettings(),
        eos_token_id=EOS_ID,
        device=device,
        dtype=dtype,
        threads=threads,
        seed=0,
        gpu_memory_utilization=0.5,
        cpu_kvcache_space_gb=1,
    )
    startup_s = time.perf_counter() - started
    prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests for _ in r.seeds]

    def bare_params() -> list[SamplingParams]:
        """What any caller of LLM.generate must build: one SamplingParams per seeded sample."""
        return [
            SamplingParams(
                temperature=1.0,
                top_p=1.0,
                seed=seed,
                max_tokens=r.max_new_tokens,
                logprobs=0,
                flat_logprobs=True,
                detokenize=False,
                ignore_eos=True,
                stop_token_ids=[EOS_ID],
            )
            for r in requests
            for seed in r.seeds
        ]

    def harness_run() -> int:
        return sum(result.num_tokens for result in generator.generate(requests))

    def bare_run() -> int:
        outputs = generator._llm.generate(prompts, bare_params(), use_tqdm=False)
        return sum(len(out.outputs[0].token_ids) for out in outputs)

    harness_run(), bare_run()  # warm-up
    wall: dict[str, list[float]] = {"harness": [], "bare": []}
    cpu: dict[str, list[float]] = {"harness": [], "bare": []}
    for _ in range(3 * repeats):
        for name, run in (("harness", harness_run), ("bare", bare_run)):
            wall_0, cpu_0 = time.perf_counter(), time.process_time()
            tokens = run()
            wall[name].append(time.perf_counter() - wall_0)
            cpu[name].append(time.process_time() - cpu_0)
    generator.close()
    return {
        "vllm_startup_s": round(startup_s, 2),
        "vllm_tokens": tokens,
        "vllm_tok_s": tokens / min(wall["harness"]),
        "bare_llm_generate_tok_s": tokens / min(wall["bare"]),
        "harness_overhead_pct": _overhead_pct(cpu),
        "harness_overhead_pct_wall": _overhead_pct(wall),
    }


def _overhead_pct(seconds: dict[str, list[float]]) -> float:
    """Extra time of the harness over bare vLLM, best run against best run, in percent."""
    return 100.0 * (min(seconds["harness"]) / min(seconds["bare"]) - 1.0)


def bench_size(name: str, args: argparse.Namespace, workdir: Path) -> dict:
    model_dir = workdir / name
    params = build_model(SIZES[name], model_dir)
    requests = make_requests(args.prompts, args.group_size, args.max_new_tokens)
    if args.device == "cuda":  # the GPU check: the harness's vLLM against bare vLLM only
        row = {"params": params}
        row |= bench_vllm(
            model_dir, requests, args.threads, args.repeats, device="cuda", dtype=args.dtype
        )
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
    set_torch_threads(args.threads)
    torch_gen = TorchGenerator(
        model_dir,
        sampling=SamplingSettings(),
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        threads=args.threads,
    )
    torch_s, torch_tokens = timed(
        lambda: sum(r.num_tokens for r in torch_gen.generate(requests)), args.repeats
    )
    hf_s, hf_tokens = timed(hf_generate_runner(model_dir, requests), args.repeats)
    row = {"params": params, **bench_vllm(model_dir, requests, args.threads, args.repeats)}
    set_torch_threads(args.threads)
    row |= {
        "torch_tok_s": torch_tokens / torch_s,
        "hf_generate_tok_s": hf_tokens / hf_s,
    }
    row |= {
        "vllm_over_hf": row["vllm_tok_s"] / row["hf_generate_tok_s"],
        "torch_over_hf": row["torch_tok_s"] / row["hf_generate_tok_s"],
        "vllm_over_torch": row["vllm_tok_s"] / row["torch_tok_s"],
    }
    return {
        key: round(value, 3) if isinstance(value, float) else value for key, value in row.items()
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Tiny model only, fewer runs.")
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads (generation.threads' default)."
    )
    parser.add_argument("--prompts", type=int, default=None, help="Prompts per call.")
    parser.add_argument("--group-size", type=int, default=8, help="Samples per prompt.")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="Response budget.")
    parser.add_argument("--repeats", type=int, default=None, help="Timed runs per backend.")
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cuda: only the harness's vLLM generator against bare vLLM, on the GPU.",
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="Engine dtype (default: float32 on CPU, bfloat16 on CUDA).",
    )
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "generation_bench: --device cuda but torch sees no CUDA device\n")
    args.prompts = args.prompts or (8 if args.quick else 16)
    args.max_new_tokens = args.max_new_tokens or (16 if args.quick else 48)
    args.repeats = args.repeats or (3 if args.quick else 5)
    args.sizes = ["tiny"] if args.quick else ["tiny", "10m"]
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    report: dict = {
        "threads": args.threads,
        "prompts": args.prompts,
        "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "device": args.device,
        "dtype": args.dtype,
    }
    with tempfile.TemporaryDirectory(prefix="generation-bench-") as workdir:
        for name in args.sizes:
            report[name] = bench_size(name, args, Path(workdir))
            print(f"{name}: {json.dumps(report[name])}", flush=True)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report), flush=True)
    return report


if __name__ == "__main__":
    main()
