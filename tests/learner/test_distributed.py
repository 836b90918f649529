"""Data-parallel learner step: 2 gloo CPU ranks match one process on the same batch.

The ranks each train one group of every 2-group minibatch; every loss divides by the whole
minibatch's totals and is scaled by the world size, so DDP's averaged gradient is the
single-process gradient, and after identical AdamW steps the weights agree to float32 rounding.
Ragged responses make the per-rank token and sequence counts differ, so a missing or wrong
normaliser shows. The `_micro` cases train each rank's share in micro-batches (as many on each
rank, `learner.runtime.update.micro_batches`) against the unsplit single process.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from buffer.collate import RolloutBatch, collate
from learner.config import ArmBase, LearnerConfig, make_arm
from learner.runtime.distributed import (
    DistContext,
    broadcast_batch,
    shutdown,
    unwrap,
)
from learner.runtime.models import build_step_models, wrap_ddp
from learner.runtime.step import check_group_split, loss_units, train_on_batch
from tests.learner.ranks import free_port, join_cpu_rank, spawn_ranks
from tests.learner.tiny import random_groups, save_tiny_policy

GROUP_SIZE, N_GROUPS = 4, 4
CASES = ("grpo_seq_mean", "grpo_dapo", "ppo", "grpo_seq_mean_micro", "ppo_micro")
# Rows of 4-9 tokens in micro-batches of 12 padded tokens: in each minibatch rank 0's share packs
# into 3 micro-batches, rank 1's into 2, split to 3 (DDP needs as many forwards on every rank);
# ppo_micro also chunks its log-probs.
MICRO = {
    "grpo_seq_mean_micro": {"micro_batch_tokens": 12},
    "ppo_micro": {"micro_batch_tokens": 12, "logprob_chunk_tokens": 5},
}


def _case(name: str) -> tuple[ArmBase, LearnerConfig]:
    arm = {
        "grpo_seq_mean": make_arm(name="g", objective="grpo", agg="seq-mean-token-mean"),
        "grpo_dapo": make_arm(name="d", objective="grpo", agg="token-mean", eps_high=0.28),
        "ppo": make_arm(name="p", objective="ppo"),
    }[name.removesuffix("_micro")]
    return arm, two_epoch_config(**MICRO.get(name, {}))


def two_epoch_config(**settings: object) -> LearnerConfig:
    """4 groups in 2 minibatches of 2 groups: one group per rank per minibatch; 2 epochs, so the
    second pass runs on weights both ranks updated identically."""
    return LearnerConfig(
        prompts_per_step=N_GROUPS,
        minibatches=2,
        ppo_epochs=2,
        lr=1e-3,
        old_logprobs="recompute",
        **settings,
    )


def _batch() -> RolloutBatch:
    """Ragged rows, two policy versions and one truncated row, so every field carries data;
    an empty response in group 0 (rank 0's share of minibatch 0) makes the ranks' sequence
    counts differ too (3 vs 4), so the seq-mean factor is not trivially 1."""
    groups = random_groups(2, GROUP_SIZE, seed=3, version=0)
    groups += random_groups(2, GROUP_SIZE, seed=4, version=1)
    first = groups[0]
    groups[0] = dataclasses.replace(
        first,
        response_ids=[[], *first.response_ids[1:]],
        behavior_logprobs=[[], *first.behavior_logprobs[1:]],
    )
    reasons = ["length"] + ["stop"] * (GROUP_SIZE - 1)
    groups[1] = dataclasses.replace(groups[1], finish_reasons=reasons)
    return collate(groups, pad_id=0)


def _step(models, batch: RolloutBatch, name: str, dist: DistContext | None = None):
    arm, cfg = _case(name)
    extra = {} if dist is None else {"dist": dist}
    return train_on_batch(
        models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8, version=1, **extra
    )


def _worker(rank: int, port: int, model_dir: Path, out: Path) -> None:
    dist = join_cpu_rank(rank, port)
    try:
        batch = broadcast_batch(_batch() if dist.is_main else None, dist)
        if rank == 1:
            torch.save({k: getattr(batch, k) for k in vars(batch)}, out / "received.pt")
        for name in CASES:
            _ddp_step(model_dir, batch, name, dist, out)
    finally:
        shutdown(dist)


def _ddp_step(model_dir: Path, batch: RolloutBatch, name: str, dist: DistContext, out: Path):
    """One wrapped step; the DDP wrappers are freed on return, before the group is destroyed."""
    arm, cfg = _case(name)
    models = wrap_ddp(build_step_models(model_dir, arm, cfg, total_steps=3), dist)
    result = _step(models, batch, name, dist)
    if dist.is_main:
        state = unwrap(models.policy.module).state_dict()
        torch.save({"state": state, "grad_norms": result.grad_norms}, out / f"{name}.pt")


def run_on_ranks(worker: Callable[[int, int, Path, Path], None], root: Path) -> tuple[Path, Path]:
    """Run `worker(rank, port, model_dir, out)` on WORLD ranks over a new tiny policy in root:
    (model_dir, out), out the directory the ranks wrote their results to (`ranks.spawn_ranks`)."""
    model_dir = save_tiny_policy(root / "model")
    return model_dir, spawn_ranks(worker, model_dir, root)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, Path]:
    """Run the 2-rank steps once for every test of the module: (model_dir, output dir)."""
    return run_on_ranks(_worker, tmp_path_factory.mktemp("ddp"))


def test_broadcast_batch_round_trips_every_field(two_ranks) -> None:
    _, root = two_ranks
    received = torch.load(root / "received.pt", weights_only=True)
    sent = _batch()
    assert set(received) == set(vars(sent))
    for name, tensor in received.items():
        expected = getattr(sent, name)
        if expected is None:  # routed_experts: only batches from an MoE torch generator
            assert tensor is None, name
            continue
        assert tensor.dtype == expected.dtype and torch.equal(tensor, expected), name


@pytest.mark.parametrize("name", CASES)
def test_two_ranks_match_one_process(two_ranks, name: str) -> None:
    model_dir, root = two_ranks
    torch.set_num_threads(1)
    single = name.removesuffix("_micro")  # one process, no micro-batches
    arm, cfg = _case(single)
    models = build_step_models(model_dir, arm, cfg, total_steps=3)
    result = _step(models, _batch(), single)
    got = torch.load(root / f"{name}.pt", weights_only=True)
    torch.testing.assert_close(got["grad_norms"], result.grad_norms, rtol=1e-5, atol=0)
    expected = models.policy.module.state_dict()
    initial = build_step_models(model_dir, arm, cfg, total_steps=3).policy.module.state_dict()
    moved = False
    for key, value in expected.items():
        torch.testing.assert_close(got["state"][key], value, rtol=1e-5, atol=1e-6, msg=key)
        moved |= not torch.equal(value, initial[key])
    assert moved, "the step changed no weight: the comparison would be vacuous"


def test_minibatch_groups_must_divide_by_world_size(tmp_path) -> None:
    # 4 groups in 2 minibatches = [2, 2] groups: fine for 1 or 2 ranks, not for 3.
    check_group_split(4, 2, 2)
    with pytest.raises(
        ValueError,
        match=r"prompts_per_step=4 in learner\.minibatches=2 gives minibatches of \[2, 2\]",
    ):
        check_group_split(4, 2, 3)
    arm, cfg = _case("grpo_seq_mean")
    models = build_step_models(save_tiny_policy(tmp_path / "m"), arm, cfg, total_steps=1)
    with pytest.raises(ValueError, match=r"multiple of learner\.minibatches"):
        _step(models, _batch(), "grpo_seq_mean", DistContext(rank=0, world_size=3, local_rank=0))


def test_loss_units_per_arm() -> None:
    assert loss_units(make_arm(name="a", objective="gspo")) == "sequences"
    assert loss_units(make_arm(name="a", objective="gspo_token")) == "sequences"
    assert loss_units(make_arm(name="a", objective="grpo")) == "sequences"
    dr_grpo = make_arm(name="a", objective="grpo", agg="seq-mean-token-sum-norm")
    assert loss_units(dr_grpo) == "sequences"
    assert loss_units(make_arm(name="a", objective="grpo", agg="token-mean")) == "tokens"
    assert loss_units(make_arm(name="a", objective="ppo")) == "tokens"


@pytest.mark.slow
@pytest.mark.e2e
def test_torchrun_learner_two_ranks_smoke(tmp_path: Path) -> None:
    """`torchrun --nproc_per_node 2 ... learner` against an embedded Redis and one generator:
    2 steps, one outcome file, every group trained once (rank 0 alone takes and commits)."""
    import subprocess
    import sys

    from buffer.server import EmbeddedRedis
    from learner.runtime.metrics_log import GroupLedger
    from tests.harness.trial_helpers import REPO, SMALL

    steps, out = 2, tmp_path / "trial"

    def component(*head: str, command: str, extra: tuple[str, ...] = ()) -> list[str]:
        return [
            *head, "-m", "harness.cli", command, str(REPO / "configs/quickstart.yaml"),
            "--arm", "gspo", "--seed", "0", "--lag", "1", "--mode", "fixed",
            "--out", str(out), "--steps", str(steps), *extra,
            *SMALL, "generation.backend=torch",
        ]  # fmt: skip

    torchrun = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2")
    torchrun += ("--master_port", str(free_port()))
    (tmp_path / "redis").mkdir()
    with EmbeddedRedis(tmp_path / "redis", appendfsync="everysec") as server:
        env = {**os.environ, "HARNESS_REDIS_URL": server.url, "HARNESS_RUN_ID": "ddp-smoke"}
        learner = subprocess.Popen(component(*torchrun, command="learner"), env=env, cwd=REPO)
        generator = subprocess.Popen(
            component(sys.executable, command="generator", extra=("--id", "gen-a")),
            env=env,
            cwd=REPO,
        )
        try:
            assert learner.wait(timeout=600) == 0
            assert generator.wait(timeout=120) == 0
        finally:
            for process in (learner, generator):
                if process.poll() is None:
                    process.kill()
    ids = [row["group_id"] for row in GroupLedger(out).read()]
    assert len(ids) == len(set(ids)) == steps * 4  # learner.prompts_per_step=4 (SMALL)
    assert (out / "learner_outcome.json").is_file()
