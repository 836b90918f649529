"""`harness plan`: parameter counts against transformers, the estimate against a measured step,
the command line, and FSDP against DDP.

The measured checks run real learner steps (`build_step_models` + `train_on_batch`) of a dense
and an MoE model in a fresh process and read its resident-memory high-water mark (VmHWM, what
`ru_maxrss` reports), reset after the models are loaded (`/proc/self/clear_refs`), so the load's
transient copies are not counted; glibc's mmap threshold is fixed at 64 KiB so freed tensors
leave the resident set at once instead of staying in malloc's heap. The estimate must be within
0.8x-1.25x of the measured increase in every setting (each run prints its ratios; they were
0.93x-1.09x for the dense model and 0.90x-1.05x for the MoE when written, with an MoE policy's
pi_old and routing passes in micro-batches, its routing record of uint8 experts and entropies in
host memory, and the entropy of log-probs reduced 128 positions at a time).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from harness.config import load_config
from harness.config.sections import ModelConfig
from harness.models.factory import ARCHITECTURES
from harness.overrides import ConfigError
from harness.planning.activations import attention_saved, mlp_saved, update_activations
from harness.planning.architecture import load_shape
from harness.planning.logits import ENTROPY_ROWS, logit_bytes
from harness.planning.memory import (
    Phase,
    estimate,
    fsdp_units,
    gathered_units,
    optimizer_step_bytes,
    persistent,
    scoring_passes,
    update_moments,
)
from harness.planning.plan import builtin_shape, parse_size, remedies
from harness.planning.routing import ROUTED_MODEL_TYPES, expert_index_bytes, routing_record
from harness.planning.setup import LearnerSetup
from tests.harness.trial_helpers import harness, run_argv

REPO = Path(__file__).resolve().parents[2]
TINY = {"vocab_size": 100, "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2}

# Hand counts (vocab 100, hidden 16, 4 heads, 2 kv heads, 2 layers; head_dim 4 unless set):
# qwen2: attention q 16*16+16, k 16*8+8, v 16*8+8, o 16*16 = 800; MLP 3*16*40 = 1920; norms 32;
#   block 2752, x2 = 5504; embedding 1600 + head 1600 + final norm 16 = 3216; total 8720.
# qwen3_moe (head_dim 8, layer 1 dense): attention q 16*32, k 16*16, v 16*16, o 32*16, q/k norms
#   8+8 = 1552; sparse MLP router 4*16 + experts 4*3*16*12 = 2368; dense MLP 1920; blocks
#   1552+2368+32 + 1552+1920+32 = 7456; root 3216; total 10672.
# qwen2_moe (tied): attention 800; router 64 + experts 2304 + shared expert 3*16*20 + its gate 16
#   = 3344; block 4176, x2 = 8352; root 1600 + 16 = 1616; total 9968.
# mixtral: attention 16*16 + 2*16*8 + 16*16 = 768; router 64 + experts 4*3*16*24 = 4672; block
#   5472, x2 = 10944; root 3216; total 14160.
CONFIGS = {
    "qwen2": (
        {"model_type": "qwen2", "intermediate_size": 40, "num_hidden_layers": 2},
        8720,
    ),
    "qwen3_moe": (
        {
            "model_type": "qwen3_moe",
            "head_dim": 8,
            "intermediate_size": 40,
            "moe_intermediate_size": 12,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [1],
        },
        10672,
    ),
    "qwen2_moe": (
        {
            "model_type": "qwen2_moe",
            "intermediate_size": 40,
            "moe_intermediate_size": 12,
            "shared_expert_intermediate_size": 20,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 2,
            "tie_word_embeddings": True,
        },
        9968,
    ),
    "mixtral": (
        {
            "model_type": "mixtral",
            "intermediate_size": 24,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 2,
        },
        14160,
    ),
}


def _write_config(directory: Path, extra: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps(TINY | {"tie_word_embeddings": False} | extra)
    )
    return directory


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameter_count_matches_the_hand_count_and_transformers(name: str, tmp_path: Path):
    extra, hand_count = CONFIGS[name]
    directory = _write_config(tmp_path / name, extra)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    assert load_shape(directory).parameters() == hand_count
    assert sum(p.numel() for p in model.parameters()) == hand_count


def test_builtin_shape_is_the_model_the_factory_builds():
    """The shipped MoE study's built-in qwen3_moe, from the config the factory would build."""
    cfg = load_config(REPO / "configs/moe_gspo_vs_grpo.yaml")
    shape = builtin_shape(cfg)
    assert shape.moe is not None and shape.moe.sparse_layers == cfg.model.num_layers
    make_config, model_class = ARCHITECTURES[cfg.model.arch]
    model = model_class(make_config(cfg.model, shape.vocab))
    assert shape.parameters() == sum(p.numel() for p in model.parameters())


def test_routed_model_types_are_the_learners_routers():
    from learner.runtime.moe.hooks import ROUTER_TYPES

    modules = {cls.__module__.rsplit(".", 1)[-1].removeprefix("modeling_") for cls in ROUTER_TYPES}
    assert modules == ROUTED_MODEL_TYPES


def test_activation_and_logit_bytes_by_hand(tmp_path: Path):
    shape = load_shape(_write_config(tmp_path / "q", CONFIGS["qwen2"][0]))
    # float32, hidden 16, 4 heads of 4: RMSNorm (4 + 4) * 16 = 128, its output 4 * 16 = 64,
    # q, repeated k and v, SDPA output, o_proj input 5 * 4 * 16 = 320, log-sum-exp 4 * 4 = 16.
    assert attention_saved(shape, 4) == 128 + 64 + 320 + 16
    # RMSNorm 128 + output 64 + gate, SiLU, up, product 4 * 4 * 40 = 640.
    assert mlp_saved(shape, 4, sparse=False) == 128 + 64 + 640
    # bf16: RMSNorm (4 + 2) * 16 = 96, output 32, 5 * 2 * 16 = 160, log-sum-exp 16.
    assert attention_saved(shape, 2) == 96 + 32 + 160 + 16
    setup = LearnerSetup(seq_len=10, logprob_chunk_tokens=4)
    # A chunk of 4 positions x 100 entries, float32: making the log-softmax holds the logits,
    # the scaled copy and the log-softmax, 4 + 8 = 12 bytes a logit; the entropy then holds
    # the log-softmax (4) and, the chunk being under ENTROPY_ROWS (128), p log p (4) of every
    # logit, the chunk's logits freed: 8. Backward: 12.
    assert logit_bytes(shape, setup, 50, chunked=True) == 4 * 100 * 12
    assert logit_bytes(shape, setup, 50, chunked=True, backward=True) == 4 * 100 * 12
    # Unchunked, the model's logits (4) stay beside the entropy: 4 + 4 + 4 = 12 a logit, as
    # much as the log-softmax's moment (the entropy's was the peak at 17 while it made a mask
    # and a second copy).
    assert logit_bytes(shape, setup, 50, chunked=False) == 50 * 100 * 12
    # bf16, chunks of 1024: the log-softmax moment 2 + 8 = 10 a logit is over the entropy's
    # 1024 * 100 * 4 + 128 * 100 * 4 = 460,800 bytes; a gradient pass's backward, 12 a logit.
    bf16 = LearnerSetup(dtype="bfloat16", seq_len=10, logprob_chunk_tokens=1024)
    assert logit_bytes(shape, bf16, 4096, chunked=True) == 1024 * 100 * 10
    assert logit_bytes(shape, bf16, 4096, chunked=True, backward=True) == 1024 * 100 * 12


def test_fsdp_divides_parameters_gradients_and_optimizer_by_the_gpus():
    shape = load_shape(REPO / "configs/model_configs/qwen2.5-0.5b.json")
    n = 494_032_768  # Qwen2.5-0.5B (tied head), as published
    assert shape.parameters() == n
    ddp_setup = LearnerSetup(gpus=8, parallel="ddp", groups=32, seq_len=1280)
    fsdp_setup = LearnerSetup(gpus=8, parallel="fsdp", groups=32, seq_len=1280)
    ddp, fsdp = estimate(shape, ddp_setup), estimate(shape, fsdp_setup)
    ddp_state, fsdp_state = persistent(shape, ddp_setup)[0], persistent(shape, fsdp_setup)[0]
    # DDP: float32 weights 4n, gradients 4n plus DDP's buckets 4n, AdamW moments 8n per GPU.
    assert (ddp_state.parameters, ddp_state.gradients, ddp_state.optimizer) == (
        4 * n,
        8 * n,
        8 * n,
    )
    # FSDP on 8: each of them / 8 (and no buckets)
    assert (fsdp_state.parameters, fsdp_state.gradients, fsdp_state.optimizer) == (
        4 * n / 8,
        4 * n / 8,
        8 * n / 8,
    )
    # The update is one micro-batch: its log-prob pass (unchunked logits, the peak) runs with
    # the last update's gradients freed; DDP's buckets stay and the head's gradient is made.
    assert ddp.update_moment == fsdp.update_moment == "log_probs"
    assert ddp.update.gradients == 4 * n + 4 * 151_936 * 896
    assert fsdp.update.gradients == 0
    assert fsdp.update.activations == ddp.update.activations  # the same rows per rank
    assert fsdp.peak < ddp.peak
    assert fsdp.host == ddp.host == 0  # host memory is what cpu_offload moves there
    # The generators run the evals: no rank holds a copy of the whole policy for them, so a
    # dense policy's only pass without gradient is the micro-batched scoring, and the state
    # under it is the update's (its shards), whatever the batch.
    small = LearnerSetup(gpus=8, parallel="fsdp", groups=1, seq_len=8)
    passes = scoring_passes(shape, small, estimate(shape, small).update)
    assert set(passes) == {"micro"}
    assert {f.name for f in dataclasses.fields(Phase)} == {
        "parameters",
        "gradients",
        "optimizer",
        "gathered",
        "activations",
        "logits",
        "routing",
        "step",
    }
    # Gathered in bf16: root (tied embedding 151,936 x 896 + final norm 896 = 136,135,552) and
    # two blocks of 14,912,384 (q/k/v/o 1,835,008 + biases 1,152, MLP 13,074,432, norms
    # 1,792); backward adds the root's unsharded gradient in bf16 and its float32 copy.
    root, block = 136_135_552, 14_912_384
    gathered = 2 * (root + 2 * block) + (2 + 4) * root
    bf16 = LearnerSetup(gpus=8, parallel="fsdp", dtype="bfloat16", groups=32, seq_len=1280)
    for micro in (None, 1280):  # one micro-batch, or 64 of one row each
        setup = LearnerSetup(**(vars(bf16) | {"micro_batch_tokens": micro}))
        backward = update_moments(shape, setup, persistent(shape, setup)[0])["backward"]
        # Every micro-batch reduce-scatters: only the shard's gradient lasts between them.
        assert (backward.gradients, backward.gathered) == (4 * n / 8, gathered)


def test_fsdp_gathers_an_untied_embedding_as_its_own_unit(tmp_path: Path):
    """`learner.runtime.sharding.shard` makes an untied model's input embedding a unit of its
    own, so the root (kept gathered from forward to backward) is the final norm and the head."""
    shape = load_shape(_write_config(tmp_path / "q", CONFIGS["qwen2"][0]))  # untied
    # CONFIGS' qwen2: embedding 1600, head 1600 + final norm 16 = root 1616, blocks of 2752.
    assert fsdp_units(shape) == (1616, 1600)
    setup = LearnerSetup(gpus=2, parallel="fsdp", dtype="bfloat16")
    # bf16: the root and two blocks, 2 * (1616 + 2 * 2752) = 14,240 (at the embedding's
    # forward, 1600 + one block is less); backward adds the root's gradient in bf16, held to
    # the end, and a block's gradient in bf16 and float32 beside it.
    assert gathered_units(shape, setup, backward=False) == 14_240
    assert gathered_units(shape, setup, backward=True) == 14_240 + 2 * 1616 + (2 + 4) * 2752
    tied = dataclasses.replace(shape, tied_embeddings=True)  # the embedding is the head
    assert fsdp_units(tied) == (1616, 0)


def test_the_update_is_its_largest_moment_not_the_sum_of_each_parts_peak(tmp_path: Path):
    """A block's backward (no logits left), the log-probs and their backward (no block in
    backward yet), AdamW's step: each on the state of its moment (tiny float32 qwen2: 8,720
    parameters, its largest tensors the embedding and the head, 100 x 16)."""
    shape = load_shape(_write_config(tmp_path / "q", CONFIGS["qwen2"][0]))
    assert shape.largest_tensor() == 1600
    setup = LearnerSetup(groups=2, group_size=2, seq_len=10)  # one GPU, one micro-batch
    state = persistent(shape, setup)[0]
    moments = update_moments(shape, setup, state)
    assert moments["backward"] == dataclasses.replace(
        state, activations=update_activations(shape, setup)
    )
    # One micro-batch: the last update's gradients are freed as it starts; by the head's
    # backward, its gradient (4 x 1600) is the only one made.
    assert moments["log_probs"] == dataclasses.replace(
        state,
        gradients=4 * 1600,
        activations=update_activations(shape, setup, working_set=False),
        logits=logit_bytes(shape, setup, 40, chunked=True, backward=True),
    )
    # The CPU's tensor-by-tensor AdamW: a square root and a quotient of the largest tensor.
    assert moments["optimizer_step"] == dataclasses.replace(state, step=2 * 4 * 1600)
    chosen = estimate(shape, setup)
    assert chosen.update == moments[chosen.update_moment]
    assert chosen.update.total == max(moment.total for moment in moments.values())
    parts_at_their_peaks = state.total + sum(
        getattr(m, name) for m in moments.values() for name in ("activations", "logits", "step")
    )
    assert chosen.update.total < parts_at_their_peaks
    # More micro-batches: the gradients of the earlier ones are there at the next log-probs.
    split = dataclasses.replace(setup, micro_batch_tokens=10)
    assert update_moments(shape, split, state)["log_probs"].gradients == state.gradients


def test_adamw_step_temporaries_by_implementation(tmp_path: Path):
    """foreach: a float32 copy of the rank's parameters (the square root of every exp_avg_sq at
    once); for_loop: two of the largest tensor; fused: none; cpu_offload: on the host."""
    shape = load_shape(_write_config(tmp_path / "q", CONFIGS["qwen2"][0]))
    fsdp = LearnerSetup(gpus=2, parallel="fsdp", groups=2, group_size=2, seq_len=10)
    expected = {"foreach": 4 * 8720 / 2, "for_loop": 2 * 4 * 1600 / 2, "fused": 0}
    for impl, step in expected.items():
        assert optimizer_step_bytes(shape, dataclasses.replace(fsdp, optimizer_impl=impl)) == step
    ddp = dataclasses.replace(fsdp, parallel="ddp", optimizer_impl="foreach")
    assert optimizer_step_bytes(shape, ddp) == 4 * 8720  # every rank steps the whole model
    offload = dataclasses.replace(fsdp, cpu_offload=True, optimizer_impl="foreach")
    assert optimizer_step_bytes(shape, offload) == 0


def test_plan_suggests_the_fused_step_when_foreach_makes_the_peak():
    """Qwen2.5-0.5B on one GPU, one row a micro-batch: foreach's copy of the parameters (1.84
    GiB) outweighs any activation, so the step is the update's peak, and the fused step fits
    where foreach does not."""
    shape = load_shape(REPO / "configs/model_configs/qwen2.5-0.5b.json")
    setup = LearnerSetup(
        parallel="fsdp", dtype="bfloat16", activation_checkpointing=True, groups=1,
        group_size=2, seq_len=1280, micro_batch_tokens=1280, logprob_chunk_tokens=256,
        optimizer_impl="foreach",
    )  # fmt: skip
    foreach = estimate(shape, setup)
    assert foreach.update_moment == "optimizer_step"
    assert foreach.update.step == 4 * shape.parameters()
    fused = estimate(shape, dataclasses.replace(setup, optimizer_impl="fused"))
    assert fused.update_moment != "optimizer_step" and fused.peak < foreach.peak
    fixes = {fix.overrides: fix.peak for fix in remedies(shape, setup, fused.peak)}
    assert fixes[("learner.optimizer_impl=fused",)] == fused.peak


# Tiny float32 qwen2 (CONFIGS): a no-grad forward keeps, per token, one block's working set
# (residual in and out 2 * 4 * 16, RMSNorm float32 temporaries 2 * 4 * 16, its output 4 * 16
# = 320, then the MLP's 3 * 4 * 40 = 480 over attention's 5 * 4 * 16 = 320), the final hidden
# states 4 * 16 = 64 and rotary cos and sin 2 * 4 * 4 = 32: 896 bytes; per row the padding
# mask and its float32 copy, 10 * 10 * (1 + 4) = 500.
DENSE_SCORING_TOKEN, DENSE_SCORING_ROW_MASK = 896, 500


def test_scoring_passes_run_in_micro_batches_of_the_whole_batch(tmp_path: Path):
    shape = load_shape(_write_config(tmp_path / "q", CONFIGS["qwen2"][0]))
    # 2 prompts x 4 = 8 rows of 10 tokens; a budget of 25 tokens is 2 rows.
    whole = LearnerSetup(groups=2, group_size=4, seq_len=10)
    split = LearnerSetup(groups=2, group_size=4, seq_len=10, micro_batch_tokens=25)
    assert (whole.scoring_rows, split.scoring_rows) == (8, 2)
    for setup, rows in ((whole, 8), (split, 2)):
        scoring = estimate(shape, setup).scoring
        tokens = rows * 10
        assert scoring.activations == tokens * DENSE_SCORING_TOKEN + rows * DENSE_SCORING_ROW_MASK
        assert scoring.logits == tokens * 100 * 12  # float32 logits and their copies
    # Over 4 minibatches the update's share is 2 rows (one micro-batch at a budget of 80
    # tokens), but the no-grad passes still see all 8 rows, 8 at a time.
    share = LearnerSetup(groups=2, group_size=4, seq_len=10, minibatches=2, micro_batch_tokens=80)
    assert (share.micro_rows, share.scoring_rows) == (4, 8)


def test_moe_pi_old_and_routing_forwards_run_in_micro_batches(tmp_path: Path):
    """Tiny float32 qwen3_moe (CONFIGS: 4 experts, top-2, layer 0 sparse, head_dim 8)."""
    shape = load_shape(_write_config(tmp_path / "m", CONFIGS["qwen3_moe"][0]))
    setup = LearnerSetup(groups=2, group_size=4, seq_len=10, micro_batch_tokens=25)
    # Routing record: 1 sparse layer x (uint8 experts 2 x 1 + float32 entropy 4) = 6 bytes a
    # token (no router logits), 80 tokens, in host memory; a part (2 rows) captures 20 of them
    # on the device, and its experts alone are 20 x 2.
    record, capture, experts = 80 * 6, 20 * 6, 20 * 2
    assert routing_record(shape, setup) == record
    # No-grad working set a token: residual and norm 320, attention 5 * 4 * 32 = 640 (over the
    # dense MLP's 480 and the sparse one's: the router's logits and, captured, the hook's three
    # float32 copies (4 + 12) * 4, the dispatch mask 8 * 2 * 5: 144), final hidden states 64,
    # rotary 2 * 4 * 8 = 64; the mask 500 a row.
    part_forward = 20 * (320 + 640 + 64 + 64) + 2 * 500
    passes = scoring_passes(shape, setup, Phase())
    assert set(passes) == {"moe_pi_old", "moe_routing"}  # no reference, no critic
    # pi_old: one part of 2 rows at a time (unchunked float32 logits and copies) and its
    # capture; the batch's record is on the host.
    assert passes["moe_pi_old"] == Phase(
        activations=part_forward, logits=20 * 100 * 12, routing=capture
    )
    # The moe/* forwards: the part scored with its routing captured (pi_old's moment), then on
    # pi_old's experts: the same forward and logits, plus the free log-probs kept (20 x 4),
    # beside the part's own experts and pi_old's slice of them (2 x 40 = 80 < the capture's
    # 120): 40 bytes over pi_old's pass, so it is the scoring column.
    assert passes["moe_routing"] == Phase(
        activations=part_forward, logits=20 * 100 * 12 + 20 * 4, routing=2 * experts
    )
    chosen = estimate(shape, setup)
    assert chosen.scoring_pass == "moe_routing"
    # The update's micro-batch (2 rows of 10): its slice of pi_old's experts, for replay.
    assert chosen.update.routing == experts
    # Without a budget: one forward of the whole batch and its capture, the record's size.
    whole = LearnerSetup(groups=2, group_size=4, seq_len=10)
    whole_forward = 80 * (320 + 640 + 64 + 64) + 8 * 500
    unsplit = scoring_passes(shape, whole, Phase())
    assert unsplit["moe_pi_old"] == Phase(
        activations=whole_forward, logits=80 * 100 * 12, routing=record
    )
    assert unsplit["moe_routing"] == Phase(
        activations=whole_forward, logits=80 * 100 * 12 + 80 * 4, routing=2 * 80 * 2
    )
    # A reference runs in micro-batches of 2 rows (not captured): no routing on the device.
    with_reference = LearnerSetup(**(vars(setup) | {"reference": True}))
    micro = scoring_passes(shape, with_reference, Phase())["micro"]
    assert micro == Phase(activations=part_forward, logits=20 * 100 * 12)


def test_moe_routing_pass_peaks_where_a_parts_routing_outweighs_its_forward(tmp_path: Path):
    """With very many sparse layers (10,000 here) a part's routing outweighs its forward's
    working set (one block's) and its logits. pi_old's pass then peaks when the capture is
    stacked beside itself; the `moe/*` pass when the part's experts are compared with pi_old's
    slice, moved to the device, beside the capture being let go."""
    tiny = load_shape(_write_config(tmp_path / "m", CONFIGS["qwen3_moe"][0]))
    assert tiny.moe is not None
    shape = dataclasses.replace(
        tiny, layers=10_000, moe=dataclasses.replace(tiny.moe, sparse_layers=10_000)
    )
    # A part of 20 tokens: capture 20 x 10,000 x 6 = 1,200,000, its experts 20 x 10,000 x 2.
    capture, experts = 20 * 10_000 * 6, 20 * 10_000 * 2
    split = LearnerSetup(groups=2, group_size=4, seq_len=10, micro_batch_tokens=25)
    passes = scoring_passes(shape, split, Phase())
    # Forward moment of pi_old: 22,760 activations + 34,000 logits + capture < 2 x capture.
    assert passes["moe_pi_old"] == Phase(routing=2 * capture)
    # The moe/* pass: its captured forward (22,760 + 34,000 + capture), its replayed one
    # (22,760 + 34,080 + 2 x experts), both < capture + experts.
    assert passes["moe_routing"] == Phase(routing=capture + experts)
    whole = LearnerSetup(groups=2, group_size=4, seq_len=10)
    unsplit = scoring_passes(shape, whole, Phase())
    assert unsplit["moe_pi_old"] == Phase(routing=2 * 4 * capture)  # all 80 tokens at once
    assert unsplit["moe_routing"] == Phase(routing=4 * (capture + experts))


def test_planner_constants_are_the_learners():
    from learner.runtime.forward import ENTROPY_ROWS as LEARNER_ENTROPY_ROWS
    from learner.runtime.moe.hooks import index_dtype

    assert ENTROPY_ROWS == LEARNER_ENTROPY_ROWS
    for experts in (4, 128, 256, 257, 32_768, 32_769):
        assert expert_index_bytes(experts) == index_dtype(experts).itemsize, experts


def test_parse_size_units_and_errors():
    assert parse_size("h100-80GB", "--gpu-memory") == 81_559 * 2**20  # 79.65 GiB, as it reports
    assert parse_size("A100-80GB", "--gpu-memory") == 80 * 2**30
    assert parse_size("80GB", "--gpu-memory") == 80e9
    assert parse_size("80 GiB", "--gpu-memory") == 80 * 2**30
    assert parse_size("81920mib", "--gpu-memory") == 80 * 2**30
    for bad in ("80", "eighty GB", "0GB", "-1GB"):
        with pytest.raises(ConfigError, match="--gpu-memory"):
            parse_size(bad, "--gpu-memory")


# --- the estimate against a measured step -------------------------------------------------

# The built-in qwen2 and qwen3_moe architectures (harness.models.factory) at hidden 128, 4
# layers (qwen3_moe: 8 experts of width 128, top-2), with the 32,000 entries of the built-in
# mistral-v1 tokenizer, so logits weigh as they do in a real model; 8 groups of 8 random rows
# (tests.learner.tiny.random_groups, at most 9 tokens).
# What the two measured models share: tokenizer, width, depth and heads.
COMMON = dict(tokenizer="mistral-v1", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2)
MEASURED_MODELS = {
    "qwen2": ModelConfig(**COMMON, intermediate_size=512),
    "qwen3_moe": ModelConfig(
        **COMMON, arch="qwen3_moe", intermediate_size=128, num_experts=8, experts_per_token=2
    ),
}
MEASURED_VOCAB = 32_000
GROUPS = 8
# name: (micro_batch_tokens, logprob_chunk_tokens, minibatches), run for both architectures.
# 36 tokens are 4 rows of 9; 144 tokens 16 rows, one minibatch's whole share at 4 minibatches,
# so there only the passes without gradient are split (16 rows at a time of the batch's 64). At
# 8 minibatches a rank's update is of 8 rows, and pi_old's pass makes the peak: of the whole
# batch at once, or of 32 rows at a time (288 tokens; an MoE places each part's routing into
# the batch's record).
SETTINGS = {
    "whole": (None, None, 1),
    "micro": (36, None, 1),
    "chunked": (None, 64, 1),
    "split_scoring": (144, None, 4),
    "scoring_whole": (None, None, 8),
    "scoring_split": (288, None, 8),
}


def measure_steps(model_dir: str, arch: str) -> None:
    """Run in a fresh process: two learner steps of `arch` per setting, printing JSON with the
    rise of resident memory from before the models were built to the step's high-water mark."""
    import gc

    from buffer.collate import collate
    from learner.config import LearnerConfig, make_arm
    from learner.runtime.models import build_step_models
    from learner.runtime.step import train_on_batch
    from tests.learner.tiny import random_groups

    torch.set_num_threads(1)
    batch = collate(random_groups(GROUPS, 8, seed=0), pad_id=0)
    arm = make_arm(name="g", objective="grpo")
    result = {"width": int(batch.input_ids.shape[1])}
    for name, (micro, chunk, minibatches) in SETTINGS.items():
        cfg = LearnerConfig(
            prompts_per_step=GROUPS,
            minibatches=minibatches,
            micro_batch_tokens=micro,
            logprob_chunk_tokens=chunk,
        )
        gc.collect()
        before = _status_kib("VmRSS")
        models = build_step_models(Path(model_dir), arm, cfg, total_steps=2)
        Path("/proc/self/clear_refs").write_text("5")  # high-water mark := now
        for version in range(2):  # the second step starts with gradients and AdamW state
            train_on_batch(
                models, batch, arm=arm, learner=cfg, group_size=8, max_len=8, version=version
            )
        result[name] = (_status_kib("VmHWM") - before) * 1024
        del models
    print(json.dumps(result))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure_and_estimate(arch: str, directory: Path) -> tuple[dict, dict]:
    """(measured, estimated) peak bytes of `arch` in each setting; each ratio printed."""
    torch.manual_seed(0)
    make_config, model_class = ARCHITECTURES[arch]
    model_class(make_config(MEASURED_MODELS[arch], MEASURED_VOCAB)).save_pretrained(directory)
    env = os.environ | {"MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    code = (
        "import sys; from tests.harness.test_plan import measure_steps; "
        "measure_steps(sys.argv[1], sys.argv[2])"
    )
    run = run_argv([sys.executable, "-c", code, str(directory), arch], env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    shape = load_shape(directory)
    estimated = {}
    for name, (micro, chunk, minibatches) in SETTINGS.items():
        setup = LearnerSetup(
            groups=GROUPS,
            group_size=8,
            minibatches=minibatches,
            seq_len=measured["width"],
            micro_batch_tokens=micro,
            logprob_chunk_tokens=chunk,
        )
        estimated[name] = estimate(shape, setup).peak
    ratios = {name: estimated[name] / measured[name] for name in estimated}
    print(f"{arch} estimated / measured:", {name: round(r, 3) for name, r in ratios.items()})
    for name, ratio in ratios.items():
        assert 0.8 <= ratio <= 1.25, (name, ratio, estimated[name], measured[name])
    return measured, estimated


needs_proc = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc"
)


@needs_proc
def test_estimate_is_within_a_quarter_of_a_measured_step(tmp_path: Path):
    measured, estimated = _measure_and_estimate("qwen2", tmp_path)
    # Both agree on what the options do: micro-batches now split the passes without gradient
    # too (pi_old's whole-batch logits are gone), as do chunked log-probs; with the update's
    # share in one piece, the budget still splits the no-grad passes' whole batch. (Measured
    # when written: 0.48, 0.52, 0.57 and 0.71; unchunked passes reduce their entropy 128
    # positions at a time, so the whole batch's step is itself smaller than it was.)
    for peaks in (measured, estimated):
        assert peaks["micro"] < 0.55 * peaks["whole"]
        assert peaks["chunked"] < 0.6 * peaks["whole"]
        assert peaks["split_scoring"] < 0.7 * peaks["whole"]
        assert peaks["scoring_split"] < 0.8 * peaks["scoring_whole"]


@needs_proc
def test_moe_estimate_is_within_a_quarter_of_a_measured_step(tmp_path: Path):
    """A Qwen3-MoE policy's pi_old pass runs in micro-batches of the budget (its routing
    captured part by part), so the options shrink its step as they do a dense one's; where
    pi_old's pass is the peak, the budget splits it too."""
    measured, estimated = _measure_and_estimate("qwen3_moe", tmp_path)
    for peaks in (measured, estimated):  # measured when written: 0.50, 0.54, 0.59 and 0.73
        assert peaks["micro"] < 0.55 * peaks["whole"]
        assert peaks["chunked"] < 0.6 * peaks["whole"]
        assert peaks["split_scoring"] < 0.7 * peaks["whole"]
        assert peaks["scoring_split"] < 0.8 * peaks["scoring_whole"]


# --- the command line ---------------------------------------------------------------------


GPU_CONFIG = "configs/gspo_vs_grpo_gpu.yaml"
HALF_B = "configs/model_configs/qwen2.5-0.5b.json"


def test_plan_prints_a_table_and_a_verdict():
    fits = harness(
        "plan",
        GPU_CONFIG,
        "--gpus",
        "8",
        "--gpu-memory",
        "80GB",
        "--model-config",
        HALF_B,
        "learner.parallel=fsdp",
        "learner.dtype=bfloat16",
        "learner.micro_batch_tokens=8192",
        "learner.logprob_chunk_tokens=1024",
    )
    assert fits.returncode == 0, fits.stderr
    for text in ("memory per GPU (GiB)", "parameters", "activations", "total", "fits: peak"):
        assert text in fits.stdout
    assert "arm: gspo" in fits.stdout  # all three arms are equal: the first is named
    assert "eval copy" not in fits.stdout  # the generators run the evals: no copy of the policy
    # The shipped settings (DDP, float32, no micro-batches, full logits) on one GPU do not fit:
    # the scoring forwards' logits of all 327,680 tokens; a micro-batch budget splits them.
    too_big = harness("plan", GPU_CONFIG, "--gpu-memory", "80GB", "--model-config", HALF_B)
    assert too_big.returncode == 0, too_big.stderr
    assert "does not fit" in too_big.stdout and "learner.micro_batch_tokens=" in too_big.stdout


def test_plan_names_the_update_moment_and_suggests_the_fused_step():
    """Qwen2.5-1.5B on one GPU of 32 GB, one row a micro-batch: with the foreach step, the step's
    float32 copy of the parameters makes the peak; the fused step (the default on cuda) fits."""
    options = (
        "--model-config", "configs/model_configs/qwen2.5-1.5b.json", "--gpu-memory", "32GB",
        "learner.parallel=fsdp", "learner.dtype=bfloat16", "learner.activation_checkpointing=true",
        "learner.logprob_chunk_tokens=256", "learner.micro_batch_tokens=1280",
    )  # fmt: skip
    foreach = harness("plan", GPU_CONFIG, *options, "learner.optimizer_impl=foreach")
    assert foreach.returncode == 0, foreach.stderr
    assert "update: AdamW step" in foreach.stdout and "AdamW step temporaries" in foreach.stdout
    assert "does not fit" in foreach.stdout
    assert "learner.optimizer_impl=fused  (peak 25.22 GiB)" in foreach.stdout
    default = harness("plan", GPU_CONFIG, *options)
    assert default.returncode == 0, default.stderr
    assert "fits: peak 25.22 GiB" in default.stdout
    assert "a block's backward in a micro-batch" in default.stdout


def test_plan_errors_are_one_line_naming_the_option():
    bad = harness("plan", GPU_CONFIG, "--gpu-memory", "80", "--model-config", HALF_B)
    assert bad.returncode == 2
    assert "--gpu-memory" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    # model.path of the shipped config is not on this machine: --model-config is named
    missing = harness("plan", GPU_CONFIG, "--gpu-memory", "80GB")
    assert missing.returncode == 2 and "--model-config" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
