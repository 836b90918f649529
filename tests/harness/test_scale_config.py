"""The learner's scale options in the config: defaults keep every hash, bad combinations are
refused in one line naming the field, and several ranks launch under torchrun."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.config import ConfigError, load_config
from harness.trial.watch import under_torchrun

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs/quickstart.yaml"


def test_scale_options_at_their_defaults_change_no_hash() -> None:
    plain = load_config(QUICKSTART)
    spelled = load_config(
        QUICKSTART,
        [
            "learner.parallel=ddp",
            "learner.dtype=float32",
            "learner.activation_checkpointing=false",
            "learner.cpu_offload=false",
        ],
    )
    assert spelled.config_hash() == plain.config_hash()
    assert "parallel" not in plain.hashed_fields()["learner"]


def test_a_set_scale_option_is_part_of_the_hash_and_the_ranks_are_not() -> None:
    plain = load_config(QUICKSTART)
    fsdp = load_config(QUICKSTART, ["learner.parallel=fsdp"])
    assert fsdp.config_hash() != plain.config_hash()
    two = load_config(QUICKSTART, ["learner.parallel=fsdp", "executor.learner_ranks=2"])
    assert two.config_hash() == fsdp.config_hash()  # resumable at another number of ranks


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["learner.dtype=bfloat16"], r"learner\.dtype=bfloat16 needs learner\.parallel=fsdp"),
        (
            ["learner.parallel=fsdp", "learner.cpu_offload=true"],
            r"learner\.cpu_offload=true needs learner\.parallel=fsdp and learner\.device=cuda",
        ),
        (
            ["executor.learner_ranks=3"],  # 16 groups per step in 2 minibatches
            r"executor\.learner_ranks=3, arm 'gspo': learner\.prompts_per_step=16 in "
            r"learner\.minibatches=2 gives minibatches of \[8, 8\] groups",
        ),
        (
            ["executor.kind=ray", "executor.learner_ranks=2", "learner.device=cuda"],
            r"executor\.learner_ranks=2 with learner\.device=cuda runs 2 ranks in the "
            r"learner's Ray bundle, which asks for executor\.learner\.gpus=0\.0",
        ),
        (["learner.parallel=zero3"], r"learner\.parallel"),
    ],
)
def test_bad_scale_settings_are_refused_naming_the_field(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(QUICKSTART, overrides)


def test_several_ranks_run_the_learner_under_torchrun() -> None:
    args = [sys.executable, "-m", "harness.cli", "learner", "c.yaml", "--arm", "a"]
    assert under_torchrun(args, 1) == args
    assert under_torchrun(args, 4) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
        "-m", "harness.cli", "learner", "c.yaml", "--arm", "a",
    ]  # fmt: skip
