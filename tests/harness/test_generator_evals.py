"""A generator answers the learner's eval requests (`harness.trial.generator_evals`), through a
real redis-server, on the built-in warm-started model: with `eval.engine: torch` (the CPU
default) the report is bitwise the one the learner used to compute on its own policy, and with
`eval.engine: generator` the rollout engine itself holds the evaluated version afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import torch

from buffer.connection import connect
from buffer.eval_requests import EvalRequests
from buffer.versions import VersionRegistry
from harness.config import load_config
from harness.evaluation.suite import make_eval_suite
from harness.generators import make_generator
from harness.models.factory import load_policy
from harness.models.model_dir import build_model_dir
from harness.trial.generator_evals import GeneratorEvals, Loaded

REPO = Path(__file__).resolve().parents[2]
RUN = "gen-evals"
# The quickstart's model as built (its 256 held-out prompts are part of the build's cache key, so
# a smaller task.eval_size here would build a second copy of the same weights: a minute of one
# core on a new machine, against about a second of evals).
SMALL_EVALS = ["evals=[]", "eval.samples=2", "eval.pass_k=[1, 2]"]


@pytest.fixture
def client(redis_server) -> Iterator[redis.Redis]:
    client = connect(redis_server.url)
    yield client
    client.close()


def _serving(client: redis.Redis, *overrides: str) -> tuple[GeneratorEvals, Path]:
    cfg = load_config(
        REPO / "configs/quickstart.yaml", ["generation.backend=torch", *SMALL_EVALS, *overrides]
    )
    model_dir = build_model_dir(cfg.model, cfg.task)  # cached after the first build
    versions = VersionRegistry(client, RUN)
    for version in (0, 5):  # v5: the same weights under another number, enough to load
        versions.publish(version, str(model_dir))
    generator = make_generator(cfg.generation, model_dir, seed=1)
    evals = GeneratorEvals(
        cfg,
        1,
        generator,
        requests=EvalRequests(client, RUN),
        versions=versions,
        generator_id="gen-0",
        model_dir=model_dir,
    )
    return evals, model_dir


def test_the_torch_engine_scores_what_the_learner_scored(client: redis.Redis) -> None:
    evals, model_dir = _serving(client)
    assert evals.engine == "torch"  # `auto` on a CPU generator
    learner = EvalRequests(client, RUN, wait_timeout_s=60)
    later, first = learner.request(5), learner.request(0)
    loaded = Loaded(0)
    assert evals.serve(loaded) > 0 and evals.served == 2  # both, the lowest version first
    assert loaded.version == 0  # the rollout engine was not touched
    suite = make_eval_suite(evals.cfg, model_dir, 1)  # the learner's former evals
    policy = load_policy(model_dir, torch.float32, "cpu")
    for request_id, step in ((first, 0), (later, 5)):
        report, seconds = learner.wait(request_id)
        assert report == suite(policy, step) and seconds > 0
        assert report.scores[0].samples == 2 and 0.0 < report.pass_rate < 1.0
    assert evals.serve(loaded) == 0.0  # nothing left to answer


def test_the_generator_engine_evaluates_on_the_rollout_engine(client: redis.Redis) -> None:
    evals, model_dir = _serving(client, "eval.engine=generator")
    learner = EvalRequests(client, RUN, wait_timeout_s=60)
    request_id = learner.request(5)
    loaded = Loaded(0)
    evals.serve(loaded)
    assert loaded.version == 5 and evals.generator.version == 5  # the loop reloads what it needs
    report, _ = learner.wait(request_id)
    on_own_model = make_eval_suite(evals.cfg, model_dir, 1)(evals.generator.model, 5)
    assert report == on_own_model
