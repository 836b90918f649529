"""The `harness` console script as a user runs it (a real subprocess)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.harness.trial_helpers import REPO, harness, run_argv


def test_help_lists_commands() -> None:
    result = harness("--help")
    assert result.returncode == 0
    for command in ("run", "trial", "learner", "generator", "report", "config", "ui"):
        assert command in result.stdout


def test_the_cli_the_config_and_the_experiment_driver_load_no_torch() -> None:
    """Reading a config, `harness --help`, `config show` and the `harness run` driver need no
    torch or transformers (importing them cost every such process 1.5-4 s of CPU); the
    components that compute import them themselves."""
    modules = "harness.cli, harness.config, harness.experiment.run"
    check = f"import sys, {modules}; print(sorted({{'torch', 'transformers'}} & set(sys.modules)))"
    result = run_argv([sys.executable, "-c", check], timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_config_show_prints_resolved_config() -> None:
    result = harness("config", "show", "configs/quickstart.yaml", "learner.lr=2e-4")
    assert result.returncode == 0, result.stderr
    assert "lr: 0.0002" in result.stdout
    assert "eps_low: 0.0003" in result.stdout  # GSPO default filled in
    assert "config hash:" in result.stdout


def test_bad_override_exits_non_zero_naming_field() -> None:
    result = harness("config", "show", "configs/quickstart.yaml", "learner.lr=abc")
    assert result.returncode != 0
    assert "learner.lr" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_config_file_is_a_clear_error() -> None:
    result = harness("config", "show", "configs/does_not_exist.yaml")
    assert result.returncode != 0
    assert "does not exist" in result.stderr


def test_mode_choices_come_from_the_contract(tmp_path: Path) -> None:
    args = ("configs/quickstart.yaml", "--arm", "gspo", "--seed", "0", "--lag", "0")
    result = harness("trial", *args, "--out", str(tmp_path / "t"), "--mode", "sideways")
    assert result.returncode == 2  # a usage error, before any trial file is written
    assert all(word in result.stderr for word in ("--mode", "'sideways'", "'fixed'", "'bounded'"))
    assert "Traceback" not in result.stderr and not (tmp_path / "t").exists()


def test_non_positive_steps_is_a_usage_error_naming_the_option(tmp_path: Path) -> None:
    """`--steps -3` used to be accepted and report success after training nothing."""
    trial = ("configs/quickstart.yaml", "--arm", "gspo", "--seed", "0", "--lag", "0")
    for command in (
        ("trial", *trial, "--out", str(tmp_path / "t")),
        ("run", "configs/quickstart.yaml", "--out", str(tmp_path / "r")),
    ):
        for steps in ("-3", "0"):
            result = harness(*command, "--steps", steps)
            assert result.returncode == 2, (command, steps, result.stdout)
            assert "--steps" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "t").exists() and not (tmp_path / "r").exists()


def test_run_with_an_unknown_storage_scheme_fails_in_one_line(tmp_path: Path) -> None:
    """A URI --out is opened before anything starts; a scheme pyarrow does not know is one
    line naming the URI (credentials left out), and nothing is created."""
    result = harness("run", "configs/quickstart.yaml", "--out", "nosuch://user:secret@b/exp")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot open storage nosuch://b/exp" in result.stderr
    assert "secret" not in result.stderr and "Traceback" not in result.stderr
    assert not (REPO / "nosuch:").exists()


def test_hardware_facts_ask_torch_only_where_a_gpu_device_node_exists(tmp_path: Path) -> None:
    """Every trial's supervisor records the hardware before starting its components: on a
    machine without a GPU device node it says `cuda_available: false` without importing torch;
    where a node exists (here: one stands in for it) torch is asked, and answers the same on
    this CPU build."""
    stand_in = tmp_path / "nvidiactl"
    stand_in.touch()
    check = (
        "import json, sys; from harness import provenance as p; "
        "p.GPU_DEVICE_NODES = tuple(sys.argv[1:]); facts = p.hardware(); "
        "print(json.dumps([facts['cuda_available'], 'torch' in sys.modules]))"
    )
    for nodes, asked_torch in (((), False), ((str(stand_in),), True)):
        result = run_argv([sys.executable, "-c", check, *nodes], timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"[false, {str(asked_torch).lower()}]"
