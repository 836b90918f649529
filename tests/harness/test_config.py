"""Config validation: valid configs load; unknown keys, wrong types and bad overrides are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.config import ReportConfig
from harness.config import ConfigError, load_config, resolved_dump, validate_config
from harness.overrides import apply_overrides, parse_override
from learner.config import RolloutLogConfig

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


MINIMAL = "name: t\narms:\n  - {name: gspo, objective: gspo}\n  - {name: grpo, objective: grpo}\n"


@pytest.mark.parametrize(
    "name",
    [
        "quickstart.yaml",
        "gspo_vs_grpo_gpu.yaml",
        "staleness_sweep.yaml",
        "moe_gspo_vs_grpo.yaml",
        "tuned_comparison.yaml",
    ],
)
def test_shipped_configs_are_valid(name: str) -> None:
    cfg = load_config(REPO / "configs" / name)
    assert cfg.arms


def test_per_objective_clip_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, MINIMAL))
    assert (cfg.arm("gspo").eps_low, cfg.arm("gspo").eps_high) == (3e-4, 4e-4)
    assert (cfg.arm("grpo").eps_low, cfg.arm("grpo").eps_high) == (0.2, 0.2)


def test_unknown_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"learner\.lrr"):
        load_config(write(tmp_path, MINIMAL + "learner: {lrr: 1.0}\n"))


def test_wrong_type_names_field_and_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"generation\.group_size.*'eight'"):
        load_config(write(tmp_path, MINIMAL + "generation: {group_size: eight}\n"))


def test_bad_override_names_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"learner\.lr.*'abc'"):
        load_config(write(tmp_path, MINIMAL), ["learner.lr=abc"])


def test_override_parsing_and_arm_addressing(tmp_path: Path) -> None:
    assert parse_override("learner.lr=1e-5") == (["learner", "lr"], 1e-5)
    assert parse_override("seeds=[0, 1]") == (["seeds"], [0, 1])
    cfg = load_config(
        write(tmp_path, MINIMAL), ["arms.grpo.agg=token-mean", "learner.lr=2e-5", "seeds=[3,4]"]
    )
    assert cfg.arm("grpo").agg == "token-mean"
    assert cfg.learner.lr == 2e-5
    assert cfg.seeds == [3, 4]


def test_seed_ranges_in_the_file_and_in_overrides(tmp_path: Path) -> None:
    # range(a,b) is Python's: seeds a to b - 1; as list items they are quoted YAML strings.
    assert load_config(write(tmp_path, MINIMAL + "seeds: range(0,4)\n")).seeds == [0, 1, 2, 3]
    cfg = load_config(write(tmp_path, MINIMAL), ['seeds=[7,"range(2,5)"]'])
    assert cfg.seeds == [7, 2, 3, 4]
    cfg = load_config(write(tmp_path, MINIMAL), ["seeds=range(0, 216)"])
    assert cfg.seeds == list(range(216))
    assert cfg.config_hash() == load_config(write(tmp_path, MINIMAL)).config_hash()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("seeds=range(3,3)", r"'range\(3,3\)' is empty; range\(a,b\) needs a < b"),
        ("seeds=rnge(0,3)", r"'rnge\(0,3\)' is neither an integer nor range\(a,b\)"),
        ("seeds=range(0,3", r"'range\(0,3' is neither an integer nor range\(a,b\)"),
        # Unquoted inside a YAML list the comma splits the range: the error shows how to quote.
        ("seeds=[0,range(2,5)]", r"'range\(2' is neither .* quote ranges inside a list"),
        ('seeds=[0,"range(0,3)"]', r"seeds has duplicates"),
    ],
)
def test_malformed_seed_ranges_are_refused_by_name(
    tmp_path: Path, override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, MINIMAL), [override])


def test_override_without_equals_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"section\.field=value"):
        apply_overrides({}, ["learner.lr"])


def test_literal_field_rejects_unknown_choice(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"arms\.0\.objective"):
        load_config(write(tmp_path, "arms:\n  - {name: x, objective: dpo}\n"))


def test_a_setting_the_arms_objective_does_not_read_is_named(tmp_path: Path) -> None:
    """Arms are typed per objective: GSPO's aggregation is fixed, so `agg` is an error naming
    the field, the reason and the objectives that take it (it used to pass silently)."""
    arms = "arms:\n  - {name: g, objective: gspo, agg: token-mean}\n"
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, arms))
    assert "arms.0: Value error, arm 'g' (gspo) does not read agg (" in str(raised.value)
    assert "only grpo arms take it): remove it" in str(raised.value)
    with pytest.raises(ConfigError, match=r"arms\.0\.eps_low: Input should be less than 1"):
        load_config(write(tmp_path, "arms:\n  - {name: p, objective: ppo, eps_low: 2}\n"))


def test_cross_field_check_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="minibatches"):
        load_config(
            write(tmp_path, MINIMAL), ["learner.minibatches=16", "learner.prompts_per_step=8"]
        )


def test_routing_replay_needs_a_moe_model(tmp_path: Path) -> None:
    text = "arms:\n  - {name: r, objective: grpo, routing_replay: old}\n"
    with pytest.raises(ConfigError, match="qwen3_moe"):
        load_config(write(tmp_path, text))
    assert load_config(write(tmp_path, text), ["model.arch=qwen3_moe"]).arm("r")


def test_duplicate_arm_names_rejected(tmp_path: Path) -> None:
    text = "arms:\n  - {name: a, objective: gspo}\n  - {name: a, objective: grpo}\n"
    with pytest.raises(ConfigError, match="unique"):
        load_config(write(tmp_path, text))


def test_config_hash_changes_with_content(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    assert load_config(path).config_hash() == load_config(path).config_hash()
    assert load_config(path).config_hash() != load_config(path, ["learner.lr=0.5"]).config_hash()


def test_report_section_is_the_analysis_report_config(tmp_path: Path) -> None:
    overrides = ["report.n_resamples=500", "report.curve_resamples=200", "report.figure_dpi=60"]
    cfg = load_config(write(tmp_path, MINIMAL), overrides)
    assert cfg.report == ReportConfig(n_resamples=500, curve_resamples=200, figure_dpi=60)
    with pytest.raises(ConfigError, match=r"report\.n_resamples.*50"):  # analysis's bound, >= 100
        load_config(write(tmp_path, MINIMAL), ["report.n_resamples=50"])


def test_one_eval_size_and_the_old_learner_field_names_its_new_place(tmp_path: Path) -> None:
    assert load_config(REPO / "configs/quickstart.yaml", ["task.eval_size=16"]).task.eval_size == 16
    with pytest.raises(ConfigError, match=r"learner\.eval_size is now task\.eval_size"):
        load_config(write(tmp_path, MINIMAL), ["learner.eval_size=16"])


@pytest.mark.parametrize("text", ["off", "'off'", "false"])
def test_appendfsync_off_survives_yaml_booleans(text: str) -> None:
    # YAML 1.1 reads a bare `off` as False; the policy is still `off` (it used to be refused).
    cfg = load_config(REPO / "configs/quickstart.yaml", [f"buffer.appendfsync={text}"])
    assert cfg.buffer.appendfsync == "off"


def test_appendfsync_on_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"buffer\.appendfsync: .*use always, everysec or off"):
        load_config(REPO / "configs/quickstart.yaml", ["buffer.appendfsync=on"])


def test_output_dir_is_a_path_or_a_storage_uri(tmp_path: Path) -> None:
    """A URI is kept verbatim (Path would fold `s3://` into `s3:/`); the executor says where
    working copies go and how often they sync."""
    cfg = load_config(write(tmp_path, MINIMAL + "output_dir: s3://bucket/runs?region=eu-west-1\n"))
    assert cfg.output_dir == "s3://bucket/runs?region=eu-west-1"
    assert load_config(write(tmp_path, MINIMAL + "output_dir: /shared/runs\n"))
    with pytest.raises(ConfigError, match=r"executor\.sync_interval_s"):
        load_config(write(tmp_path, MINIMAL + "executor: {sync_interval_s: 0}\n"))


# ---- dynamic sampling (DAPO): an arm setting with a staleness rule and a buffer depth ----------

DAPO = (
    "name: t\narms:\n  - {name: grpo, objective: grpo}\n"
    "  - {name: dapo, objective: grpo, agg: token-mean, dynamic_sampling_rounds: 3}\n"
)


def test_dynamic_sampling_is_an_arm_setting_off_by_default(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, DAPO), ["buffer.max_depth=1024"])
    assert cfg.dynamic_sampling_rounds("dapo") == 3 and cfg.dynamic_sampling_rounds("grpo") == 0
    assert cfg.dynamic_sampling_rounds() == 3
    # off, it is left out of the resolved config, so configs written before it keep their hash
    assert "dynamic_sampling_rounds" not in resolved_dump(cfg.arm("grpo"))
    assert resolved_dump(cfg.arm("dapo"))["dynamic_sampling_rounds"] == 3


def test_dynamic_sampling_needs_fixed_mode_and_names_the_arms(tmp_path: Path) -> None:
    want = r"arms \['dapo'\] set dynamic_sampling_rounds, which needs staleness.mode: fixed"
    with pytest.raises(ConfigError, match=want + r" \(got bounded\)"):
        load_config(write(tmp_path, DAPO), ["staleness.mode=bounded"])


def test_dynamic_sampling_is_refused_on_an_arm_with_a_critic(tmp_path: Path) -> None:
    text = "name: t\narms:\n  - {name: ppo, objective: ppo, dynamic_sampling_rounds: 1}\n"
    with pytest.raises(ConfigError, match="dynamic_sampling_rounds"):
        load_config(write(tmp_path, text))


def test_extra_rounds_raise_the_buffer_depth_a_checkpoint_interval_needs(tmp_path: Path) -> None:
    # checkpoint_every 10 x (1 + 3 rounds) + lag 0 + 2 = 42 draws of 16 prompts = 672 groups
    want = (
        r"\(learner.checkpoint_every x \(1 \+ max dynamic_sampling_rounds\) \+ max lag \+ 2\) "
        r"\* learner.prompts_per_step = 672"
    )
    with pytest.raises(ConfigError, match=want):
        load_config(
            write(tmp_path, DAPO),
            ["learner.checkpoint_every=10", "learner.prompts_per_step=16", "buffer.max_depth=600"],
        )
    load_config(
        write(tmp_path, DAPO),
        ["learner.checkpoint_every=10", "learner.prompts_per_step=16", "buffer.max_depth=672"],
    )


OMITTING = [
    "arms.grpo.adv_estimator=rloo",  # adv_norm is not read, so it is left out
    "arms.gspo.dynamic_sampling_rounds=0",
    "task.eval_offset=0",
    "learner.parallel=ddp",
]


def test_model_dump_is_pydantics_own_and_the_resolved_form_omits_the_table() -> None:
    """Hash stability lives in one table (`OMITTED_AT_DEFAULT`), not in `model_dump`: the
    plain dump keeps every field, the resolved form leaves the table's out at their default,
    and the resolved form validates again to a config of the same hash."""
    cfg = load_config(REPO / "configs/quickstart.yaml", OMITTING)
    dumped, resolved = cfg.model_dump(mode="json"), resolved_dump(cfg)
    assert dumped["tuning"] is None and dumped["task"]["eval_offset"] == 0
    assert dumped["learner"]["parallel"] == "ddp" and "adv_norm" in dumped["arms"][1]
    assert "tuning" not in resolved and "selection" not in resolved
    assert "eval_offset" not in resolved["task"] and "parallel" not in resolved["learner"]
    grpo = resolved["arms"][1]
    assert grpo["adv_estimator"] == "rloo" and "adv_norm" not in grpo
    assert {"lr", "dynamic_sampling_rounds"}.isdisjoint(grpo)
    assert validate_config(resolved).config_hash() == cfg.config_hash()


def test_adv_std_is_kept_where_a_group_std_is_read_and_refused_elsewhere() -> None:
    """Issue 37 changed what `adv_std`'s default computes, so an arm that reads it records it
    (new hash, new numbers); an arm that does not leaves it out (old hash) and may not set it."""
    cfg = load_config(REPO / "configs/quickstart.yaml", ["arms.grpo.adv_estimator=rloo"])
    gspo, grpo, ppo = resolved_dump(cfg)["arms"][:3]
    assert gspo["adv_std"] == "unbiased" and "adv_std" not in grpo and "adv_std" not in ppo
    population = load_config(REPO / "configs/quickstart.yaml", ["arms.gspo.adv_std=population"])
    assert resolved_dump(population)["arms"][0]["adv_std"] == "population"
    assert population.config_hash() != load_config(REPO / "configs/quickstart.yaml").config_hash()
    again = validate_config(resolved_dump(population))
    assert again.config_hash() == population.config_hash()
    assert again.arms[0].adv_std == "population"  # type: ignore[union-attr]
    for unread in ("arms.grpo.adv_norm=mean_only", "arms.grpo.adv_estimator=reinforce_pp"):
        with pytest.raises(ConfigError, match=r"sets adv_std: population, but only adv_estim"):
            load_config(REPO / "configs/quickstart.yaml", [unread, "arms.grpo.adv_std=population"])


def test_the_eval_engine_is_omitted_at_auto_and_kept_otherwise() -> None:
    """`eval.engine` came after configs were written: `auto` keeps their hash, a chosen engine
    is written and hashed; `auto` means the torch copy on CPU generators, the engine on CUDA."""
    auto = load_config(REPO / "configs/quickstart.yaml")
    assert "engine" not in resolved_dump(auto)["eval"]
    assert auto.eval.engine_on("cpu") == "torch" and auto.eval.engine_on("cuda") == "generator"
    chosen = load_config(REPO / "configs/quickstart.yaml", ["eval.engine=generator"])
    assert resolved_dump(chosen)["eval"]["engine"] == "generator"
    assert chosen.eval.engine_on("cpu") == "generator"
    assert chosen.config_hash() != auto.config_hash()
    assert validate_config(resolved_dump(chosen)) == chosen
    with pytest.raises(ConfigError, match=r"eval\.engine"):
        load_config(REPO / "configs/quickstart.yaml", ["eval.engine=learner"])


def test_the_rollout_log_is_omitted_at_its_default_and_kept_otherwise() -> None:
    """`learner.rollout_log` came after configs were written: its default (every step, every
    group) keeps their hash; a sparser log is written and hashed; nonsense is refused."""
    default = load_config(REPO / "configs/quickstart.yaml")
    assert default.learner.rollout_log == RolloutLogConfig(every=1, share=1.0)
    assert "rollout_log" not in resolved_dump(default)["learner"]
    sparse = load_config(
        REPO / "configs/quickstart.yaml",
        ["learner.rollout_log.every=5", "learner.rollout_log.share=0.25"],
    )
    assert resolved_dump(sparse)["learner"]["rollout_log"] == {"every": 5, "share": 0.25}
    assert sparse.config_hash() != default.config_hash()
    assert validate_config(resolved_dump(sparse)) == sparse
    for bad in ("learner.rollout_log.every=-1", "learner.rollout_log.share=0"):
        with pytest.raises(ConfigError, match=r"learner\.rollout_log"):
            load_config(REPO / "configs/quickstart.yaml", [bad])


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_resolves_to_itself(path: Path) -> None:
    cfg = load_config(path)  # objective_zoo.yaml loads a plugin (tests/conftest.py restores)
    again = validate_config(resolved_dump(cfg))
    assert again == cfg and again.config_hash() == cfg.config_hash()
