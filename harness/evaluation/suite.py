"""The eval suite a generator runs on each version the learner asks for (every
`learner.eval_every` steps; `harness.trial.generator_evals`).

Each eval set (`evals` in the config, or `task`'s held-out split as `heldout`) keeps its own
rendered prompts and verifier. At step s it is scored
- greedily: `harness.models.warm_start.greedy_eval`, the function that has always produced
  `eval/pass_rate`, so the primary set's greedy rate is the same number it always was;
- with `eval.samples` samples per prompt (when > 0): drawn by the rollouts' own torch sampler
  (`TorchGenerator.around` the learner's policy: generation.temperature, top_p, top_k, one
  torch.Generator per sample) with the seed `eval_sample_seed(trial seed, s, set, prompt,
  sample)`. The seed names no arm, so matched arms draw the same random numbers, and nothing
  depends on timing, so a fixed-mode CPU trial repeats its evals bitwise. From the c correct out
  of n samples of each prompt: pass1_sampled = mean c/n, pass@k = mean unbiased pass@k.
A response is correct when its reward is >= 1, the rule of `eval/pass_rate`.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from torch import nn
from transformers import PreTrainedTokenizerBase

from contract.evals import EvalReport, EvalSetScore
from contract.pass_at_k import mean_pass_at_k
from harness.config import ExperimentConfig
from harness.generators.base import Generator, GenRequest
from harness.generators.torch_backend import TorchGenerator
from harness.models.tokenizer import encode_prompt, load_tokenizer, response_text
from harness.models.warm_start import greedy_eval
from harness.tasks.base import Prompt, RewardFn
from harness.tasks.factory import held_out_prompts, make_rendered_task
from harness.tasks.rewards import make_reward_fn
from learner.algorithms.sampling_dist import SamplingSettings


def eval_sample_seed(
    trial_seed: int, step: int, eval_set: str, prompt_index: int, sample_index: int
) -> int:
    """A stable 63-bit seed of one eval sample (blake2b, like the rollouts' `sample_seed`, but
    personalised apart from it so eval samples never replay a rollout's random numbers)."""
    packed = struct.pack("<4q", trial_seed, step, prompt_index, sample_index) + eval_set.encode()
    digest = hashlib.blake2b(packed, digest_size=8, person=b"gspo-eval").digest()
    return int.from_bytes(digest, "little") >> 1


def is_correct(reward: float) -> bool:
    return reward >= 1.0


def sampled_scores(correct: list[int], n: int, pass_k: list[int]) -> tuple[float, dict[int, float]]:
    """(mean over prompts of c / n, {k: mean unbiased pass@k}) from per-prompt correct counts."""
    pass1 = sum(c / n for c in correct) / len(correct)
    return pass1, {k: mean_pass_at_k(correct, n, k) for k in pass_k}


@dataclass(frozen=True)
class EvalSet:
    """One set's rendered prompts and the verifier of its task."""

    name: str
    prompts: list[Prompt]
    reward_fn: RewardFn


class EvalSuite:
    """`suite(model, step)`: every set's scores at `step`, the primary set first."""

    def __init__(
        self,
        sets: list[EvalSet],
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_new_tokens: int,
        samples: int,
        pass_k: list[int],
        sampling: SamplingSettings,
        trial_seed: int,
    ) -> None:
        if not sets:
            raise ValueError("an eval suite needs at least one eval set")
        self.sets = sets
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.samples = samples
        self.pass_k = sorted(pass_k)
        self.sampling = sampling
        self.trial_seed = trial_seed

    def __call__(self, model: nn.Module, step: int) -> EvalReport:
        was_training = model.training
        model.eval()
        try:
            return EvalReport(tuple(self.score(s, model, step) for s in self.sets))
        finally:
            model.train(was_training)

    def on_engine(self, engine: Generator, step: int) -> EvalReport:
        """Every set's scores at `step` on a rollout engine (vLLM) holding the version: greedy
        with its argmax decoding, samples with its seeded sampler and the same seeds."""
        scores = []
        for eval_set in self.sets:
            prompts_ids = [encode_prompt(self.tokenizer, p.text) for p in eval_set.prompts]
            responses = engine.greedy(prompts_ids, self.max_new_tokens)
            rewards = [
                eval_set.reward_fn(response_text(self.tokenizer, ids), prompt.ground_truth)[0]
                for prompt, ids in zip(eval_set.prompts, responses, strict=True)
            ]
            greedy_rate = sum(is_correct(r) for r in rewards) / len(rewards)
            scores.append(self._scores(eval_set, greedy_rate, engine, step))
        return EvalReport(tuple(scores))

    def score(self, eval_set: EvalSet, model: nn.Module, step: int) -> EvalSetScore:
        greedy = greedy_eval(
            model,
            self.tokenizer,
            eval_set.reward_fn,
            eval_set.prompts,
            max_new_tokens=self.max_new_tokens,
        )
        if self.samples == 0:
            return self._scores(eval_set, greedy.pass_rate, None, step)
        sampler = TorchGenerator.around(
            model,
            sampling=self.sampling,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        return self._scores(eval_set, greedy.pass_rate, sampler, step)

    def _scores(
        self, eval_set: EvalSet, greedy_rate: float, sampler: Generator | None, step: int
    ) -> EvalSetScore:
        n_prompts = len(eval_set.prompts)
        if self.samples == 0 or sampler is None:
            nan_k = {k: math.nan for k in self.pass_k}
            return EvalSetScore(eval_set.name, n_prompts, greedy_rate, 0, math.nan, nan_k)
        correct = self.sampled_correct(eval_set, sampler, step)
        pass1, at_k = sampled_scores(correct, self.samples, self.pass_k)
        return EvalSetScore(eval_set.name, n_prompts, greedy_rate, self.samples, pass1, at_k)

    def sampled_correct(self, eval_set: EvalSet, generator: Generator, step: int) -> list[int]:
        """Correct samples per prompt, out of `self.samples`, drawn at `step` by `generator`
        (the rollouts' torch sampler around the scored model, or a rollout engine)."""
        requests = [
            GenRequest(
                prompt_ids=encode_prompt(self.tokenizer, prompt.text),
                seeds=[
                    eval_sample_seed(self.trial_seed, step, eval_set.name, prompt.index, j)
                    for j in range(self.samples)
                ],
                max_new_tokens=self.max_new_tokens,
            )
            for prompt in eval_set.prompts
        ]
        results = generator.generate(requests)
        counts = []
        for prompt, result in zip(eval_set.prompts, results, strict=True):
            texts = [response_text(self.tokenizer, ids) for ids in result.response_ids]
            rewards = [eval_set.reward_fn(text, prompt.ground_truth)[0] for text in texts]
            counts.append(sum(is_correct(r) for r in rewards))
        return counts


def make_eval_suite(cfg: ExperimentConfig, model_dir: Path, trial_seed: int) -> EvalSuite:
    """The experiment's eval sets, rendered for the model's tokenizer and scored as rollouts are
    (the same prompts for every arm and seed; the sample seeds differ by seed, not by arm)."""
    tokenizer = load_tokenizer(model_dir)
    sets = [
        EvalSet(
            name,
            held_out_prompts(make_rendered_task(task, tokenizer), task),
            make_reward_fn(task),
        )
        for name, task in cfg.eval_sets()
    ]
    return EvalSuite(
        sets,
        tokenizer,
        max_new_tokens=cfg.generation.max_new_tokens,
        samples=cfg.eval.samples,
        pass_k=cfg.eval.pass_k,
        sampling=cfg.generation.sampling(),
        trial_seed=trial_seed,
    )
