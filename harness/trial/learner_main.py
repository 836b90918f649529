"""`harness learner`: wire the experiment config to the learner loop and run one learner.

The learner package knows nothing about tasks or tokenizers (dependencies point one way); this
module supplies the Redis-backed buffer, version registry, eval requests (which the generators
answer, `harness.trial.generator_evals`) and weight store.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buffer.connection import BufferConnectionError, RunStateLostError, redis_failures_in_one_line
from buffer.eval_requests import EvalRequests
from buffer.streams import RolloutConsumer, Telemetry, connect, request_stop
from buffer.versions import InitialWeightsMismatchError, RunStateWatch, VersionRegistry
from buffer.weight_store import WeightStore
from contract.layout import WEIGHTS_DIR, TrialPaths
from contract.record import TrialRecordError, read_trial_record, write_json_atomic
from contract.trial import TrialSpec
from harness.config import ConfigError, ExperimentConfig
from harness.launch.processes import die_with_torchrun_agent
from harness.models.model_dir import build_model_dir, weights_digest
from harness.models.tokenizer import encode_prompt, load_tokenizer, response_text
from harness.storage.remote_weights import RemoteWeightStore
from harness.storage.setup import setup_component_sync
from harness.storage.trial_storage import (
    LEARNER_FILES,
    LEARNER_PROGRESS,
    TrialSync,
)
from harness.tasks.mixture import make_train_mixture
from harness.trial.disk_space import disk_full_as_one_line
from learner.runtime.checkpoint import CheckpointStore, ResumeError
from learner.runtime.distributed import barrier, init_distributed, shutdown
from learner.runtime.loop import LearnerOutcome, LearnerPorts, LearnerTask, run_learner
from learner.runtime.records import StepRecords
from learner.runtime.task import TextDecoder, nothing_to_upload

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class _RankZeroOnly:
    """Stands in for Redis and the weight store on ranks > 0, which never use them."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"{name}: only rank 0 talks to Redis and the weight store")


# Fault injection for tests only: the learner process exits abruptly (os._exit, no cleanup, as a
# SIGKILL would leave it) right after logging step N, i.e. after publishing version N and, unless
# N is a checkpoint step, before committing it. Never set outside tests.
FAULT_EXIT_AFTER_STEP_ENV = "HARNESS_FAULT_LEARNER_EXIT_AFTER_STEP"
FAULT_EXIT_CODE = 86


def _fault_injection() -> Callable[[int, dict[str, float]], None] | None:
    raw = os.environ.get(FAULT_EXIT_AFTER_STEP_ENV)
    if not raw:
        return None
    exit_after = int(raw)

    def on_step(step: int, _metrics: dict[str, float]) -> None:
        if step == exit_after:
            print(f"fault injection: exiting after step {step}", flush=True)
            os._exit(FAULT_EXIT_CODE)

    return on_step


class RedisFailureError(ConfigError):
    """Redis died, or came back without the run's state. Not a config error, but the user fixes
    it the same way, so `harness learner` prints this one line (no traceback) and the
    supervisor's failure reason quotes it."""


class LearnerDiskFullError(ConfigError):
    """A write of the learner failed for lack of space (`harness.trial.disk_space`): one line,
    like a Redis failure, which the supervisor's failure reason quotes."""


class ResumeFailedError(ConfigError):
    """A resume that would lose or invent data (no intact checkpoint, a missing or damaged step
    file: `learner.runtime.checkpoint.ResumeError`): one line, no traceback, like the others."""


@contextlib.contextmanager
def resume_failures_as_one_line() -> Iterator[None]:
    """A ResumeError raised inside becomes a ResumeFailedError (`harness learner` prints it)."""
    try:
        yield
    except ResumeError as exc:
        raise ResumeFailedError(str(exc)) from None


@contextlib.contextmanager
def redis_failures_as_one_line(url: str) -> Iterator[None]:
    """A dead Redis or a lost run state, raised anywhere inside, becomes a RedisFailureError."""
    try:
        with redis_failures_in_one_line(url):
            yield
    except (BufferConnectionError, RunStateLostError) as exc:
        raise RedisFailureError(str(exc)) from None


def require_checkpoint_version(versions: VersionRegistry, paths: TrialPaths) -> None:
    """A resumed learner's checkpoint of step k was saved after it published vk, so Redis must
    still hold vk or later.

    An empty registry means Redis lost the run's state (restarted with AOF off): generators would
    wait for a version that never comes, so fail now with RunStateLostError instead of after
    take_timeout_s. A registry that holds an earlier version lost only its last writes (a crash
    under `appendfsync everysec` drops up to a second, a truncated AOF more); the weights of vk
    are still in the weight store, so republishing vk repairs it, and the locations of earlier
    versions the store still holds are restored.
    """
    store = WeightStore(paths.weights)
    # An AOF truncated by a crash loses the newest writes: locations of versions a generator may
    # still need come back from the weight store (a version gone from both fails that generator
    # in one line instead).
    versions.restore_locations({v: store.path(v) for v in store.versions()})
    # The checkpoint the learner will resume from: the newest one that is intact with its step
    # files. A damaged newer one proves nothing about the registry (a bounded-mode resume that
    # fell back past it rewound the registry to before it: republishing its version would
    # hand the generators withdrawn weights).
    checkpoints = CheckpointStore(paths.checkpoints, records=StepRecords(paths.root).vouched)
    step = checkpoints.newest_usable(paths.root) if checkpoints.has_checkpoints() else None
    if step is None:
        return
    current = versions.current()
    if current is not None and current[0] < step and step in store.versions():
        versions.publish(step, store.path(step))
        return
    versions.require(step, f"the learner's checkpoint of step {step} came after v{step}")


def name_initial_weights(versions: VersionRegistry, paths: TrialPaths, model_dir: Path) -> None:
    """Check this node's model against the one the trial was prepared with (trial.json), then
    name it in Redis for the generators (before v0 is published, so none can miss it)."""
    digest = weights_digest(model_dir)
    try:
        record = read_trial_record(paths.root)
    except TrialRecordError:
        record = None  # the supervisor replaces an invalid record; Redis still gets the digest
    prepared = record.initial_weights_digest if record is not None else None
    if prepared is not None and prepared != digest:
        raise InitialWeightsMismatchError(
            f"the learner's model {model_dir} has weights with sha256 {digest[:12]}..., but the "
            f"trial was prepared with {prepared[:12]}... ({record.model_dir}): every node must "
            "load the same model (mount model.path, or model.cache_dir for the built-in model, "
            "on storage all nodes share)"
        )
    versions.record_initial_weights(digest, "the learner")


def trial_prompt_ids(
    cfg: ExperimentConfig,
    seed: int,
    model_dir: Path,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> Callable[[int], Sequence[int]]:
    """Prompt index -> the prompt tokens a generator of this trial sends for it: prompt `index`
    of the training stream (`task`, or the `train_tasks` mixture) for `seed`, rendered and
    encoded with the model's tokenizer (`tokenizer`, loaded from `model_dir` when not given)
    exactly as `generator_main.GroupMaker.request` does. The mixture is built once; intake
    compares every group's prompt with it."""
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_dir)
    mixture = make_train_mixture(cfg, tokenizer)

    @functools.lru_cache(maxsize=4096)  # a step asks for each of its prompts a few times
    def prompt_ids(index: int) -> tuple[int, ...]:
        _, prompt = mixture.prompt(seed, index)
        return tuple(encode_prompt(tokenizer, prompt.text))

    return prompt_ids


def text_decoder(tokenizer: PreTrainedTokenizerBase) -> TextDecoder:
    """The rollout log's decoder (the learner imports no tokenizer): a prompt as the generator
    rendered it, special tokens and all; a response as every verifier read it
    (`response_text`: cut at EOS, special tokens skipped), so a logged reward reads against
    the text it was given for."""

    def prompt(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False)

    return TextDecoder(prompt=prompt, response=functools.partial(response_text, tokenizer))


def learner_task(
    cfg: ExperimentConfig, spec: TrialSpec, paths: TrialPaths, steps: int | None
) -> LearnerTask:
    arm = cfg.arm(spec.arm)
    model_dir = build_model_dir(cfg.model, cfg.task)
    tokenizer = load_tokenizer(model_dir)
    return LearnerTask(
        arm=arm,
        learner=arm.training_settings(cfg.learner),  # the shared settings with the arm's own
        mode=spec.mode,
        lag=spec.lag,
        seed=spec.seed,
        group_size=cfg.generation.group_size,
        max_new_tokens=cfg.generation.max_new_tokens,
        model_dir=model_dir,
        trial_dir=paths.root,
        steps=steps,
        sampling=cfg.generation.sampling(),  # the learner scores under the generators' sampling
        prompt_ids=trial_prompt_ids(cfg, spec.seed, model_dir, tokenizer),  # intake checks them
        decode=text_decoder(tokenizer),  # the rollout log's text columns
        sync_every=cfg.regime(spec.arm).sync_every,
    )


def run_learner_component(
    cfg: ExperimentConfig,
    spec: TrialSpec,
    paths: TrialPaths,
    *,
    redis_url: str,
    run_id: str,
    steps: int | None,
    resume: bool,
) -> LearnerOutcome:
    """Run the learner to the end of the trial and record its outcome next to the metrics.

    Under `torchrun` every rank runs this; only rank 0 uses the Redis client and writes files.
    A full disk (weights, checkpoint, metrics) ends it with one LearnerDiskFullError line.
    """
    with disk_full_as_one_line(paths.root, error=LearnerDiskFullError, keep=(ConfigError,)):
        die_with_torchrun_agent()  # a rank outlives no SIGKILLed supervisor (no-op single-process)
        dist = init_distributed(cfg.learner.device, group_of_one=cfg.learner.parallel == "fsdp")
        sync = setup_component_sync(paths.root) if dist.is_main else None
        if sync is not None:  # a private working copy (Ray, bucket): the bucket's state first
            sync.pull(LEARNER_FILES)
        barrier(dist)  # every rank loads the checkpoint that rank 0 has just fetched
        on_step = _fault_injection() if dist.is_main else None
        with contextlib.ExitStack() as owned:  # closes the Redis client, then shuts dist down
            owned.enter_context(redis_failures_as_one_line(redis_url))  # exits last: sees all
            owned.callback(shutdown, dist)
            task = learner_task(cfg, spec, paths, steps)
            if dist.is_main:
                watch = RunStateWatch(run_id)  # a reconnect to a Redis that restarted empty fails
                client = owned.enter_context(
                    connect(
                        redis_url, cfg.buffer.tls_ca_file, check_connection=watch.check_connection
                    )
                )
                versions = VersionRegistry(client, run_id, watch=watch)
                if resume:  # before anything recreates the run's keys
                    require_checkpoint_version(versions, paths)
                name_initial_weights(versions, paths, task.model_dir)
                buffer = RolloutConsumer(client, run_id, cfg.buffer)  # creates the consumer group
                telemetry = Telemetry(client, run_id)
                weights = WeightStore(paths.weights)
                before_ack = nothing_to_upload
                if sync is not None:  # a resume elsewhere reads the bucket: upload, then ack
                    before_ack = functools.partial(sync.push, LEARNER_FILES)
                    weights = RemoteWeightStore(paths.weights, sync.remote.child(WEIGHTS_DIR))
                    on_step = _with_progress_push(on_step, sync)
                evals = EvalRequests(client, run_id, wait_timeout_s=task.take_timeout_s)
                evals.withdraw_all()  # an earlier learner's requests: nobody waits for them
                ports = LearnerPorts(buffer, telemetry, versions, weights, evals, before_ack)
            else:
                stand_in = _RankZeroOnly()
                ports = LearnerPorts(stand_in, stand_in, stand_in, stand_in, stand_in)
            with resume_failures_as_one_line():
                outcome = run_learner(task, ports, resume=resume, on_step=on_step, dist=dist)
            if dist.is_main:
                # Every step trained and every eval recorded: the run is over, so generators
                # (which stay to answer eval requests, and extra rounds) may leave. A supervisor
                # sets the same flag when the learner exits; generators started by hand need it.
                request_stop(client, run_id)
        if dist.is_main:
            _record_outcome(paths, outcome, sync)
        return outcome


def _record_outcome(paths: TrialPaths, outcome: LearnerOutcome, sync: TrialSync | None) -> None:
    """Rank 0: the outcome file (pushed to the bucket with the learner's files) and one line."""
    write_json_atomic(
        paths.learner_outcome,
        {
            "status": outcome.status,
            "steps_completed": outcome.steps_completed,
            "diverged_reason": outcome.diverged_reason,
        },
    )
    if sync is not None:
        sync.push(LEARNER_FILES)
    print(json.dumps({"learner": outcome.status, "steps": outcome.steps_completed}), flush=True)


def _with_progress_push(
    on_step: Callable[[int, dict[str, float]], None] | None, sync: TrialSync
) -> Callable[[int, dict[str, float]], None]:
    """`on_step`, then the learner's progress (metrics, evals, ledger) to the bucket every
    sync interval, so the driver's progress display and restart budget see it."""

    def step_done(step: int, metrics: dict[str, float]) -> None:
        sync.push_now_and_then(LEARNER_PROGRESS)
        if on_step is not None:
            on_step(step, metrics)

    return step_done
