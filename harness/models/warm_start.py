"""Supervised warm start of the built-in model, and the greedy eval the learner reuses.

RL from a random tiny model gets reward ~0 for thousands of steps, so every arm would measure
noise. The warm start trains on the task's training stream (prompt + answer + EOS, loss on the
answer and EOS tokens only) just long enough that the greedy pass rate on the eval split is
non-trivial but far from solved: the RL arms then compete over the remaining headroom. The pass
rate is controlled by `model.warm_start_steps` and measured, not assumed (`WarmStartReport`).
The target response is the prompt's ground truth, also for `file` tasks (so a file whose ground
truths are not literal answers makes a poor warm start: use a pre-trained `model.path` there).

Near misses (`model.warm_start_near_miss = q`): a share q of the examples target the answer plus
one instead (`harness.models.near_miss`; `repeat`: one repetition too many). A model trained only
on right answers is either weak (RL then has to teach it arithmetic from rare successes: +0.06
greedy in 50 steps, too slow to tell arms apart) or already solves the task. With near misses it
computes the sum well but, at the last digits, puts about q of its mass on the off-by-one answer:
greedy is often wrong while samples are often right, which is where RL with a verifiable reward
acts on real models (it raises pass@1 towards pass@k by amplifying answers the model already
samples). Which examples miss is a counter-based draw keyed by (init_seed, index), like the prompt
stream itself.

Determinism: all randomness comes from `torch.manual_seed(init_seed)` inside `fork_rng` (the
caller's global RNG state is restored afterwards) and from the task stream of seed `init_seed`;
the intra-op thread count is pinned to WARM_START_THREADS during the build and restored after,
because float reductions split over a different number of threads round differently.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from harness.config import ModelConfig
from harness.models.near_miss import NearMissStream
from harness.models.tokenizer import encode_prompt, response_text
from harness.tasks.base import Prompt, Task
from harness.tasks.rewards import RewardFn

# One thread: bitwise-identical weights on any machine, and the tiny default model is
# Python-overhead bound, so more threads would barely help.
WARM_START_THREADS = 1
# AdamW settings and schedule of the warm start (not exposed in ModelConfig: only steps, lr and
# batch size change what the RL arms start from in ways worth sweeping).
ADAM_BETAS = (0.9, 0.98)
WEIGHT_DECAY = 0.0
GRAD_CLIP_NORM = 1.0
# Linear warmup over a fixed number of steps, then a constant rate: no decay tied to the total,
# so a run of N steps is exactly the first N steps of any longer run and the pass rate grows with
# `warm_start_steps` along one trajectory (a cosine decay would re-shape it for every N).
WARMUP_STEPS = 50
LOSS_LOG_EVERY = 25  # steps between entries of the recorded loss curve
IGNORE_INDEX = -100  # F.cross_entropy's ignore_index: prompt and padding positions
# Measurement of the result, recorded in warm_start.json.
EVAL_BATCH_SIZE = 64
SAMPLED_TEMPERATURE = 1.0
SAMPLES_PER_PROMPT = 8


@dataclass(frozen=True)
class EvalResult:
    """Mean reward over prompts; `pass_rate` counts rewards >= 1 (equal for 0/1 verifiers)."""

    pass_rate: float
    reward_mean: float
    n: int


@dataclass(frozen=True)
class WarmStartReport:
    """What the warm start did and how good the result is; saved as warm_start.json."""

    steps: int
    near_miss: float  # share of examples that targeted the near miss (model.warm_start_near_miss)
    lr: float
    batch_size: int
    init_seed: int
    threads: int
    seconds: float
    loss_curve: list[tuple[int, float]]
    eval_n: int
    eval_max_new_tokens: int
    greedy_pass_rate: float
    sampled_reward_mean: float
    sampled_temperature: float
    samples_per_prompt: int

    def to_json_dict(self) -> dict[str, object]:
        return asdict(self)


@contextmanager
def pinned_threads(threads: int) -> Iterator[None]:
    """Run with `threads` intra-op threads, restoring the previous count afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def sft_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt], max_seq_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels), right-padded; labels are IGNORE_INDEX off-answer.

    Sequence = prompt ids + ground-truth ids + EOS; labels equal the ids on the answer and EOS.
    """
    rows: list[tuple[list[int], int]] = []
    for prompt in prompts:
        answer = [*encode_prompt(tokenizer, prompt.ground_truth), tokenizer.eos_token_id]
        ids = encode_prompt(tokenizer, prompt.text) + answer
        if len(ids) > max_seq_len:
            raise ValueError(
                f"warm-start example {prompt.text!r} -> {prompt.ground_truth!r} has {len(ids)} "
                f"tokens > model.max_seq_len={max_seq_len}; raise model.max_seq_len"
            )
        rows.append((ids, len(answer)))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (ids, answer_len) in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
        labels[row, len(ids) - answer_len : len(ids)] = torch.tensor(ids[-answer_len:])
    return input_ids, mask, labels  # each (B, T)


def answer_loss(
    model: PreTrainedModel, input_ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Mean next-token cross-entropy over answer tokens (position t predicts token t+1)."""
    logits = model(input_ids=input_ids, attention_mask=mask).logits  # (B, T, V)
    shifted = logits[:, :-1].reshape(-1, logits.shape[-1])  # (B*(T-1), V)
    targets = labels[:, 1:].reshape(-1)  # (B*(T-1),)
    return F.cross_entropy(shifted.float(), targets, ignore_index=IGNORE_INDEX)


def lr_factor(step: int) -> float:
    """Multiplier of the learning rate at `step` (0-based): linear warmup, then 1."""
    return min(1.0, (step + 1) / WARMUP_STEPS)


LossFn = Callable[
    [PreTrainedModel, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]  # (model, input_ids, attention_mask, labels) -> scalar loss


class TrainStream(Protocol):
    """What training reads: a `Task`, or a view of one (the chat warm start's `SftTask`)."""

    def train_prompt(self, seed: int, index: int) -> Prompt: ...


def train_supervised(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: TrainStream,
    config: ModelConfig,
    loss_fn: LossFn = answer_loss,
) -> list[tuple[int, float]]:
    """Run `config.warm_start_steps` AdamW steps on the stream of seed `config.init_seed`.

    Step k reads train prompts k*B .. k*B+B-1. Returns (step, loss) every LOSS_LOG_EVERY steps.
    `loss_fn` is `answer_loss` here; the chat warm start passes its cheaper `solution_loss`.
    """
    steps, batch = config.warm_start_steps, config.warm_start_batch_size
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.warm_start_lr, betas=ADAM_BETAS, weight_decay=WEIGHT_DECAY
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    curve: list[tuple[int, float]] = []
    model.train()
    for step in range(steps):
        prompts = [task.train_prompt(config.init_seed, step * batch + i) for i in range(batch)]
        loss = loss_fn(model, *sft_batch(tokenizer, prompts, config.max_seq_len))
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"warm-start loss is {loss.item()} at step {step}; lower model.warm_start_lr"
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP_NORM)
        optimizer.step()
        schedule.step()
        if step % LOSS_LOG_EVERY == 0 or step == steps - 1:
            curve.append((step, round(loss.item(), 6)))
    model.eval()
    return curve


def answer_budget(tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt]) -> int:
    """Longest answer + 1 tokens: enough to show EOS or a wrong extra token after any answer."""
    return max(len(encode_prompt(tokenizer, p.ground_truth)) for p in prompts) + 1


@torch.no_grad()
def generate_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Prompt],
    *,
    max_new_tokens: int,
    do_sample: bool,
    temperature: float,
) -> list[str]:
    """Responses as verifiers see them (`response_text`, exactly as in rollouts), batched with
    left padding and the KV cache. `prompts` hold rendered text (`make_rendered_task`)."""
    encoded = [encode_prompt(tokenizer, p.text) for p in prompts]
    width = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, ids in enumerate(encoded):  # left padding: generation continues every row's end
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        mask[row, width - len(ids) :] = 1
    device = next(model.parameters()).device
    sampling = {"temperature": temperature, "top_p": 1.0, "top_k": 0} if do_sample else {}
    output = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **sampling,
    )  # (B, width + <= max_new_tokens)
    return [response_text(tokenizer, row) for row in output[:, width:].tolist()]


def score(
    reward_fn: RewardFn, prompts: list[Prompt], responses: list[str], repeats: int
) -> EvalResult:
    """Mean reward and pass rate; `responses` holds `repeats` consecutive entries per prompt."""
    truths = [p.ground_truth for p in prompts for _ in range(repeats)]
    rewards = [reward_fn(text, truth)[0] for text, truth in zip(responses, truths, strict=True)]
    n = len(rewards)
    return EvalResult(sum(r >= 1.0 for r in rewards) / n, sum(rewards) / n, n)


def greedy_eval(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    reward_fn: RewardFn,
    prompts: list[Prompt],
    *,
    max_new_tokens: int,
    batch_size: int = EVAL_BATCH_SIZE,
) -> EvalResult:
    """Greedy decoding of every prompt (batched, KV cache), scored by `reward_fn`.

    Its `pass_rate` is also the learner's `eval/pass_rate`. It takes the reward function
    (`rewards.make_reward_fn(task_config)`) rather than the task, so a custom `task.reward_fn` is
    honoured in eval exactly as in rollouts.
    """
    responses: list[str] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        responses += generate_responses(
            model, tokenizer, chunk, max_new_tokens=max_new_tokens, do_sample=False, temperature=1.0
        )
    return score(reward_fn, prompts, responses, repeats=1)


def sampled_reward_mean(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    reward_fn: RewardFn,
    prompts: list[Prompt],
    *,
    max_new_tokens: int,
    temperature: float,
    samples_per_prompt: int,
    seed: int,
) -> EvalResult:
    """Reward of `samples_per_prompt` samples per prompt at `temperature` (RL's starting point).

    Uses the global torch RNG inside fork_rng, seeded by `seed`, so the caller's state is kept.
    """
    repeated = [p for p in prompts for _ in range(samples_per_prompt)]
    responses: list[str] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(repeated), EVAL_BATCH_SIZE):
            chunk = repeated[start : start + EVAL_BATCH_SIZE]
            responses += generate_responses(
                model,
                tokenizer,
                chunk,
                max_new_tokens=max_new_tokens,
                do_sample=True,
                temperature=temperature,
            )
    return score(reward_fn, prompts, responses, repeats=samples_per_prompt)


def measure(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    reward_fn: RewardFn,
    prompts: list[Prompt],
    *,
    config: ModelConfig,
    budget: int,
    curve: list[tuple[int, float]],
    seconds: float,
    samples_per_prompt: int = SAMPLES_PER_PROMPT,
) -> WarmStartReport:
    """Greedy and sampled reward of the trained model on `prompts`, with how it was trained.

    Shared by both warm starts so their warm_start.json records mean the same thing.
    """
    greedy = greedy_eval(model, tokenizer, reward_fn, prompts, max_new_tokens=budget)
    sampled = sampled_reward_mean(
        model,
        tokenizer,
        reward_fn,
        prompts,
        max_new_tokens=budget,
        temperature=SAMPLED_TEMPERATURE,
        samples_per_prompt=samples_per_prompt,
        seed=config.init_seed,
    )
    return WarmStartReport(
        steps=config.warm_start_steps,
        near_miss=config.warm_start_near_miss,
        lr=config.warm_start_lr,
        batch_size=config.warm_start_batch_size,
        init_seed=config.init_seed,
        threads=WARM_START_THREADS,
        seconds=round(seconds, 3),
        loss_curve=curve,
        eval_n=len(prompts),
        eval_max_new_tokens=budget,
        greedy_pass_rate=greedy.pass_rate,
        sampled_reward_mean=sampled.reward_mean,
        sampled_temperature=SAMPLED_TEMPERATURE,
        samples_per_prompt=samples_per_prompt,
    )


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    reward_fn: RewardFn,
    *,
    config: ModelConfig,
    eval_size: int,
) -> WarmStartReport:
    """Train in place (pinned threads) and measure greedy and sampled reward on the eval split."""
    started = time.perf_counter()
    stream: TrainStream = task
    if config.warm_start_near_miss > 0.0:
        stream = NearMissStream(task, config.warm_start_near_miss)
    with pinned_threads(WARM_START_THREADS):
        curve = train_supervised(model, tokenizer, stream, config)
        seconds = time.perf_counter() - started
        prompts = task.eval_prompts(eval_size)
        budget = answer_budget(tokenizer, prompts)
        return measure(
            model,
            tokenizer,
            reward_fn,
            prompts,
            config=config,
            budget=budget,
            curve=curve,
            seconds=seconds,
        )
