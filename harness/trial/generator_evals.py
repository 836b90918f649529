"""A generator's share of the evals: run the eval requests of published versions.

The learner asks for the evals of version v once v is published (`buffer.eval_requests`) and
records what comes back; a generator claims the request between its rollout rounds, loads v and
runs the experiment's eval suite (`harness.evaluation.suite`: every set greedily, plus seeded
samples for pass@k). Where the suite runs is `eval.engine`:
- `torch`: a float32 torch copy of the model in this process, loaded with v's weights: the
  arithmetic of the learner's former evals, so the scores on CPU are bitwise what they were;
- `generator`: the rollout engine itself with v loaded (vLLM's greedy and seeded sampling, or the
  torch generator's own model): no second copy of the policy anywhere, which is what lets the
  GSPO paper's 30B-A3B fit. The engine then holds v, and the rollout loop reloads the version it
  needs next (one extra weight sync per eval).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from buffer.eval_requests import EvalRequests, request_version
from buffer.versions import VersionRegistry
from contract.evals import EvalReport
from harness.config import ExperimentConfig
from harness.evaluation.suite import EvalSuite, make_eval_suite
from harness.generators.base import Generator
from harness.generators.torch_backend import TorchGenerator
from harness.models.tokenizer import load_tokenizer
from harness.storage.remote_weights import WeightFetcher
from harness.trial.fault_files import crash_if_armed

# Fault injection for kill/restart tests: while the file this names exists and holds version v,
# the generator that claims the eval request of v deletes it and exits abruptly holding the
# request's lease (as a SIGKILL mid-eval would).
FAULT_CRASH_EVAL_FILE_ENV = "HARNESS_FAULT_GENERATOR_CRASH_EVAL_FILE"


@dataclass
class Loaded:
    """The version the rollout engine holds (an eval on the engine changes it), and the run's
    timeline number read before it was loaded (`buffer.timeline`: what its groups are tagged
    with; a lower bound is safe, it can only make the learner drop a group it could train)."""

    version: int
    timeline: int = 0


class GeneratorEvals:
    """Claims and answers the run's eval requests on this generator (module docstring)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        seed: int,
        generator: Generator,
        *,
        requests: EvalRequests,
        versions: VersionRegistry,
        generator_id: str,
        model_dir: Path,
        fetcher: WeightFetcher | None = None,
    ) -> None:
        self.cfg = cfg
        self.requests, self.versions, self.fetcher = requests, versions, fetcher
        self.generator, self.generator_id = generator, generator_id
        self.engine = cfg.eval.engine_on(cfg.generation.device)
        self.suite: EvalSuite = make_eval_suite(cfg, model_dir, seed)
        self._model_dir = model_dir
        self._threads = cfg.generation.threads
        self._copy: TorchGenerator | None = None  # the `torch` engine's model, made at first use
        self.served = 0

    def serve(self, loaded: Loaded) -> float:
        """Answer every eval request there is now; returns the seconds spent."""
        spent = 0.0
        while (request_id := self.requests.claim(self.generator_id)) is not None:
            version = request_version(request_id)
            crash_if_armed(
                FAULT_CRASH_EVAL_FILE_ENV,
                version.__eq__,
                f"holding the eval request of version {version}",
            )
            started = time.monotonic()
            report = self.evaluate(request_version(request_id), loaded)
            seconds = time.monotonic() - started
            self.requests.answer(request_id, report, seconds)
            self.served += 1
            spent += seconds
        return spent

    def evaluate(self, version: int, loaded: Loaded) -> EvalReport:
        """The suite's report of published `version` on this generator's eval engine."""
        location = self.versions.location(version)
        if self.fetcher is not None:  # the announced path is on the learner's node
            location = self.fetcher.fetch(version)
        if self.engine == "torch":
            model = self._torch_copy()
            model.load_weights(version, location)
            return self.suite(model.model, version)
        if loaded.version != version:
            self.generator.load_weights(version, location)
            loaded.version = version
        if isinstance(self.generator, TorchGenerator):
            return self.suite(self.generator.model, version)
        return self.suite.on_engine(self.generator, version)

    def _torch_copy(self) -> TorchGenerator:
        if self._copy is None:
            tokenizer = load_tokenizer(self._model_dir)
            self._copy = TorchGenerator(
                self._model_dir,
                sampling=self.suite.sampling,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                threads=self._threads,
                dtype=torch.float32,
            )
        return self._copy
