"""Learner runs in-process against a real redis-server, as the loop tests set them up.

Each test keeps its own arm, learner settings and groups; what they share is the shape of the
task (fixed mode, lag 0, the tiny policy's 8 new tokens) and a fresh set of buffer objects per
run, so a second call acts as a restarted learner process (no state from the first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from transformers import AutoModelForCausalLM

from buffer.consumer import RolloutConsumer
from buffer.schema import RolloutGroup, make_group_id
from buffer.telemetry import Telemetry
from buffer.versions import VersionRegistry
from buffer.weight_store import WeightStore
from learner.config import ArmBase, LearnerConfig
from learner.runtime.loop import LearnerOutcome, LearnerPorts, LearnerTask, run_learner
from tests.learner.tiny import random_groups


def fixed_task(
    arm: ArmBase,
    learner: LearnerConfig,
    *,
    seed: int,
    group_size: int,
    model_dir: Path,
    trial_dir: Path,
    take_timeout_s: float,
) -> LearnerTask:
    """A fixed-mode, lag-0 task on the tiny policy (8 new tokens a response)."""
    return LearnerTask(
        arm=arm,
        learner=learner,
        mode="fixed",
        lag=0,
        seed=seed,
        group_size=group_size,
        max_new_tokens=8,
        model_dir=model_dir,
        trial_dir=trial_dir,
        take_timeout_s=take_timeout_s,
    )


def pushed_group(
    run_id: str, seed: int, *, batch: int, prompt: int, version: int, group_size: int, draw: int
) -> RolloutGroup:
    """A random group (`random_groups`, drawn with seed `draw`) as a generator of run `run_id`
    pushes it: prompt `prompt` of batch `batch`, sampled by `version`, its id from the trial
    `seed`."""
    [group] = random_groups(1, group_size, seed=draw)
    return dataclasses.replace(
        group,
        run_id=run_id,
        group_id=make_group_id(seed, batch, prompt),
        prompt_index=prompt,
        policy_version=version,
    )


def no_eval(_model: object, _step: int) -> float:
    """An eval that costs nothing: these tests read the training rows, not eval scores."""
    return 0.0


class StoreEvals:
    """The learner's eval port for a run with no generator process: each request is answered
    at once by `score(model, version)` on the version's weights read back from the weight store,
    what a generator loads (`no_eval` skips the load)."""

    def __init__(self, weights_dir: Path, score: Callable[[object, int], float]) -> None:
        self.store, self.score = WeightStore(weights_dir), score

    def request(self, version: int) -> str:
        return str(version)

    def wait(self, request_id: str) -> tuple[float, float]:
        version = int(request_id)
        if self.score is no_eval:
            return 0.0, 0.0
        model = AutoModelForCausalLM.from_pretrained(self.store.path(version))
        return self.score(model, version), 0.0

    def pending_versions(self) -> set[int]:
        return set()


def run_on_redis(
    task: LearnerTask,
    client,
    run_id: str,
    *,
    weights_dir: Path,
    evaluate: Callable[[object, int], float] = no_eval,
    resume: bool = False,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> LearnerOutcome:
    """One learner process on run `run_id`: a fresh consumer, telemetry and version registry."""
    ports = LearnerPorts(
        buffer=RolloutConsumer(client, run_id),
        telemetry=Telemetry(client, run_id),
        versions=VersionRegistry(client, run_id),
        weights=WeightStore(weights_dir),
        evals=StoreEvals(weights_dir, evaluate),
    )
    return run_learner(task, ports, resume=resume, on_step=on_step)
