"""FSDP2 learner (`learner.parallel=fsdp`): 2 gloo CPU ranks match one unsharded process.

Each case trains 3 steps on the same ragged batch (2 minibatches of 2 groups, one group per rank
per minibatch, 2 epochs) with 2 sharded ranks and with one plain process, and compares the
losses, the gradient norms and the weights after every step (float32, 1e-5). The ranks' token
and sequence counts differ (an empty response, ragged lengths), so a wrong normaliser or a
missing world-size factor shows. `_scale` cases add micro-batches (as many per rank), chunked
log-probs and activation checkpointing; the single process runs without them. `gspo_untied_scale`
trains a policy whose output head is not its input embedding: the embedding is then an FSDP unit
of its own (`sharding.embedding_unit`), gathered once per forward on every rank while the root
(final norm, head) serves a rank-dependent number of log-prob chunks; a tied one stays in the
root, and PPO's critic (no head) has its own embedding unit too. Two `_scale` cases also step
AdamW another way on the sharded ranks (`learner.optimizer_impl`: fused kernels on the untied
policy, foreach ops on PPO's policy and critic) against the single process's tensor-by-tensor
step: the implementations agree on DTensor shards up to float rounding.

bf16 (`learner.dtype=bfloat16`): trains, and at identical weights its log-probs stay within a
bound of float32's (the bf16 rounding of a forward): what `mismatch/kl_behavior` shows against
a float32 generator.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from buffer.collate import RolloutBatch
from learner.algorithms.masking import LOSS_AGGREGATIONS
from learner.config import ArmBase, LearnerConfig, make_arm
from learner.runtime.checkpoint import CheckpointStore, TrainingState
from learner.runtime.distributed import DistContext, barrier, shutdown
from learner.runtime.forward import policy_logprobs, scoring
from learner.runtime.models import build_step_models, checkpoint_modules
from learner.runtime.sharding import gather_full_weights, is_sharded
from learner.runtime.step import StepModels, train_on_batch
from tests.learner.ranks import join_cpu_rank
from tests.learner.test_distributed import GROUP_SIZE, _batch, run_on_ranks, two_epoch_config
from tests.tiny_models import DENSE_POLICY, tiny_model

STEPS = 3
SCALE = {"micro_batch_tokens": 12, "logprob_chunk_tokens": 5, "activation_checkpointing": True}
CASES: dict[str, tuple[dict[str, object], dict[str, object]]] = {
    "gspo": ({"objective": "gspo"}, {}),
    **{f"grpo_{agg}": ({"objective": "grpo", "agg": agg}, {}) for agg in LOSS_AGGREGATIONS},
    "ppo": ({"objective": "ppo"}, {}),
    "gspo_scale": ({"objective": "gspo"}, SCALE),
    "ppo_scale": ({"objective": "ppo"}, SCALE | {"optimizer_impl": "foreach"}),
    "gspo_untied_scale": ({"objective": "gspo"}, SCALE | {"optimizer_impl": "fused"}),
}
UNTIED = {"gspo_untied_scale"}  # cases on the untied policy (`_model_dir`)
# bf16 forward vs float32 at identical weights on the tiny policy: measured max |delta logprob|
# 1.2e-3 (mean 3.8e-4) over the batch's response tokens, i.e. a ratio within [0.9991, 1.0012];
# the bound (ratio within [0.990, 1.010]) leaves 8x room. Deeper models round more: a real run
# shows its gap in mismatch/kl_behavior.
BF16_LOGPROB_BOUND = 0.01


def _case(name: str, **extra: object) -> tuple[ArmBase, LearnerConfig]:
    arm_fields, scale = CASES[name]
    return make_arm(name="a", **arm_fields), two_epoch_config(**scale, **extra)


def _train(models: StepModels, batch: RolloutBatch, name: str, cfg: LearnerConfig, dist):
    """STEPS steps on the batch: (per-step policy loss, per-step grad norms)."""
    arm, _ = _case(name)
    losses, norms = [], []
    for step in range(STEPS):
        result = train_on_batch(
            models, batch, arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8,
            version=step, dist=dist,
        )  # fmt: skip
        losses.append(result.metrics["policy/loss"])
        norms.append(result.grad_norms)
    return losses, norms


def _worker(rank: int, port: int, model_dir: Path, out: Path) -> None:
    dist = join_cpu_rank(rank, port)
    try:
        for name in CASES:
            _sharded_case(model_dir, name, dist, out)
        _bf16_case(model_dir, dist, out)
        _damaged_shard_case(model_dir, dist, out)
    finally:
        shutdown(dist)


def _model_dir(model_dir: Path, name: str) -> Path:
    """The tied tiny policy of `run_on_ranks`, or the untied one `sharded_runs` saves by it."""
    return model_dir.parent / "untied" if name in UNTIED else model_dir


def _embedding_units(models: StepModels) -> list[bool]:
    """Whether the policy's (and the critic's) input embedding is an FSDP unit of its own."""
    modules = [models.policy.module] + ([models.value.module] if models.value else [])
    embeddings = [getattr(m, "backbone", m).get_input_embeddings() for m in modules]
    return [isinstance(embedding, FSDPModule) for embedding in embeddings]


def _sharded_case(model_dir: Path, name: str, dist: DistContext, out: Path) -> None:
    arm, cfg = _case(name, parallel="fsdp")
    models = build_step_models(_model_dir(model_dir, name), arm, cfg, total_steps=STEPS)
    assert is_sharded(models.policy.module)
    units = _embedding_units(models)
    losses, norms = _train(models, _batch(), name, cfg, dist)
    weights = gather_full_weights(models.policy.module, dist)  # every rank takes part
    critic = None
    if models.value is not None:
        critic = gather_full_weights(models.value.module, dist)
    if dist.is_main:
        record = {"losses": losses, "norms": norms, "weights": weights, "critic": critic}
        torch.save(record | {"embedding_units": units}, out / f"{name}.pt")


def _bf16_case(model_dir: Path, dist: DistContext, out: Path) -> None:
    """bf16 log-probs at the initial weights, then 3 steps of GSPO."""
    arm, cfg = _case("gspo", parallel="fsdp", dtype="bfloat16")
    models = build_step_models(model_dir, arm, cfg, total_steps=STEPS)
    batch = _batch()
    with scoring(models.policy.module):
        initial_lp, _ = policy_logprobs(models.policy.module, batch.input_ids, batch.attention_mask)
    losses, norms = _train(models, batch, "gspo", cfg, dist)
    weights = gather_full_weights(models.policy.module, dist, torch.bfloat16)
    if dist.is_main:
        record = {"initial_lp": initial_lp, "losses": losses, "norms": norms, "weights": weights}
        torch.save(record, out / "bf16.pt")


def _damaged_shard_case(model_dir: Path, dist: DistContext, out: Path) -> None:
    """Checkpoints of steps 1 and 2 (PPO: policy, critic, both optimisers); rank 1's shard of
    step 2 is damaged; every rank skips step 2 and loads step 1's weights and optimiser state."""
    arm, cfg = _case("ppo", parallel="fsdp")
    models = build_step_models(model_dir, arm, cfg, total_steps=STEPS)
    modules = checkpoint_modules(models)
    store = CheckpointStore(out / "checkpoints")
    saved = {}
    for step in (1, 2):
        _train_once(models, cfg, dist, step)
        saved[step] = gather_full_weights(models.policy.module, dist)
        store.save(TrainingState(step=step), modules, dist)
    shard = out / "checkpoints" / "step-000002" / "shards" / "__1_0.distcp"
    if dist.is_main:
        shard.write_bytes(b"\0" + shard.read_bytes()[1:])
    barrier(dist)
    skipped: list[str] = []
    state = store.load(modules, say=skipped.append)
    loaded = gather_full_weights(models.policy.module, dist)
    _train_once(models, cfg, dist, 3)  # the loaded optimiser state steps on
    after = gather_full_weights(models.policy.module, dist)
    if dist.is_main:
        record = {"step": state.step, "said": skipped, "saved": saved[1], "loaded": loaded}
        torch.save(record | {"after": after}, out / "damaged.pt")


def _train_once(models: StepModels, cfg: LearnerConfig, dist: DistContext, version: int) -> None:
    arm, _ = _case("ppo")
    train_on_batch(
        models, _batch(), arm=arm, learner=cfg, group_size=GROUP_SIZE, max_len=8,
        version=version, dist=dist,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory) -> tuple[Path, Path]:
    """Run every 2-rank case once for the module: (model_dir, output dir)."""
    root = tmp_path_factory.mktemp("fsdp")
    tiny_model(replace(DENSE_POLICY, tie_embeddings=False)).save_pretrained(root / "untied")
    return run_on_ranks(_worker, root)


@pytest.mark.parametrize("name", list(CASES))
def test_two_sharded_ranks_match_one_process(sharded_runs, name: str) -> None:
    model_dir, root = sharded_runs
    torch.set_num_threads(1)
    arm, cfg = _case(name)
    plain = LearnerConfig(**{**cfg.model_dump(), **dict.fromkeys(SCALE, None)} | {
        "activation_checkpointing": False, "optimizer_impl": "auto"
    })  # fmt: skip
    models = build_step_models(_model_dir(model_dir, name), arm, plain, total_steps=STEPS)
    initial = {k: v.clone() for k, v in models.policy.module.state_dict().items()}
    losses, norms = _train(models, _batch(), name, plain, DistContext())
    got = torch.load(root / f"{name}.pt", weights_only=True)
    # Tied (every case but the untied one): the embedding is the head, in the root.
    assert got["embedding_units"] == [name in UNTIED] + ([True] if models.value else [])
    torch.testing.assert_close(got["losses"], losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["norms"], norms, rtol=1e-5, atol=0)
    moved = False
    for key, value in models.policy.module.state_dict().items():
        # atol 1e-5, the bound: k_proj's bias has a gradient of rounding noise only
        # (softmax ignores a constant shift of every key), which AdamW turns into ~1e-6 steps.
        torch.testing.assert_close(got["weights"][key], value, rtol=1e-5, atol=1e-5, msg=key)
        moved |= not torch.equal(value, initial[key])
    assert moved, "the steps changed no weight: the comparison would be vacuous"
    if models.value is not None:
        for key, value in models.value.module.state_dict().items():
            torch.testing.assert_close(got["critic"][key], value, rtol=1e-5, atol=1e-5, msg=key)


def test_bf16_trains_and_stays_near_float32_at_identical_weights(sharded_runs) -> None:
    model_dir, root = sharded_runs
    arm, cfg = _case("gspo")
    models = build_step_models(model_dir, arm, cfg, total_steps=STEPS)
    batch = _batch()
    with scoring(models.policy.module):
        float_lp, _ = policy_logprobs(models.policy.module, batch.input_ids, batch.attention_mask)
    got = torch.load(root / "bf16.pt", weights_only=True)
    mask = batch.response_mask.bool()
    gap = (got["initial_lp"] - float_lp)[mask].abs()
    assert got["initial_lp"].dtype == torch.float32  # log-probs from float32 logits
    assert 0 < gap.max() < BF16_LOGPROB_BOUND, gap.max()
    assert all(torch.isfinite(torch.tensor(got["losses"])))
    assert all(w.dtype == torch.bfloat16 for w in got["weights"].values())
    initial = models.policy.module.state_dict()
    moved = any(
        not torch.equal(w.float(), initial[k].to(torch.bfloat16).float())
        for k, w in got["weights"].items()
    )
    assert moved, "bf16 training changed no published weight"


def test_a_damaged_shard_makes_every_rank_resume_from_the_previous_checkpoint(
    sharded_runs,
) -> None:
    _, root = sharded_runs
    got = torch.load(root / "damaged.pt", weights_only=True)
    assert got["step"] == 1
    assert "step-000002 skipped: shards/__1_0.distcp is damaged" in got["said"][0]
    assert got["said"][-1].startswith("resuming from checkpoint step-000001")
    moved = False
    for key, value in got["saved"].items():
        assert torch.equal(got["loaded"][key], value), key  # step 1's weights, bit for bit
        moved |= not torch.equal(got["after"][key], value)
    assert moved, "the step after the resume changed no weight"
