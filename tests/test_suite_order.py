"""The suite's own scheduling aids: the module table tests.timing_log writes, the longest-first
order tests/conftest.py hands out, and the shared models tests.prebuild_models builds."""

from __future__ import annotations

import json

from harness.config import load_config
from harness.models.model_dir import builtin_cache_key
from tests.harness.trial_helpers import SMALL, SMALL_MODEL
from tests.prebuild_models import REPO, SHARED_MODELS
from tests.timing_log import (
    UNKNOWN_SECONDS_PER_TEST,
    longest_first,
    mean_module_seconds,
    summary,
)


def _line(nodeid: str, seconds: float, worker: str = "gw0", when: str = "call") -> str:
    return json.dumps({"id": nodeid, "when": when, "d": seconds, "w": worker, "t": 100.0})


def test_module_seconds_are_each_modules_mean_over_the_logs_that_ran_it() -> None:
    first = [
        _line("tests/a.py::test_x", 2.0, when="setup"),
        _line("tests/a.py::test_x", 3.0),
        _line("tests/b.py::test_y[1]", 1.0, worker="gw1"),
        "",
    ]
    second = [_line("tests/a.py::test_x", 7.0), _line("tests/c.py::test_z", 0.04)]
    assert mean_module_seconds([first, second]) == {
        "tests/a.py": 6.0,
        "tests/b.py": 1.0,
        "tests/c.py": 0.0,
    }
    assert "total 6 worker-seconds" in summary(first)


def test_longest_first_orders_known_modules_by_seconds_and_new_ones_by_their_tests() -> None:
    collected = (
        ["tests/new.py"] * 40
        + ["tests/short.py"] * 3
        + ["tests/long.py", "tests/tie_b.py", "tests/tie_a.py"]
    )
    known = {
        "tests/long.py": 50.0,
        "tests/short.py": 1.0,
        "tests/tie_a.py": 5.0,
        "tests/tie_b.py": 5.0,
    }
    assert 40 * UNKNOWN_SECONDS_PER_TEST > 5.0  # the unknown module weighs by its 40 tests
    assert longest_first(collected, known) == [
        "tests/long.py",
        "tests/new.py",
        "tests/tie_a.py",
        "tests/tie_b.py",
        "tests/short.py",
    ]


def test_the_module_table_names_existing_modules() -> None:
    table = json.loads((REPO / "tests/module_seconds.json").read_text())
    assert all((REPO / module).is_file() for module in table), (
        "rewrite it: tests.timing_log --write"
    )
    assert list(table.values()) == sorted(table.values(), reverse=True)


def test_the_prebuilt_models_are_the_ones_the_tests_build() -> None:
    """SMALL's trials, the quickstart as shipped, and gsm8k_format_cpu's model with the
    overrides its test runs: the prebuild's cache keys are those the tests' configs give, and a
    change to SMALL's other overrides (or the test's) that moved its model's key would show."""

    def key(config: str, overrides: list[str]) -> str:
        cfg = load_config(REPO / config, overrides)
        return builtin_cache_key(cfg.model, cfg.task)

    prebuilt = [key(config, list(overrides)) for config, overrides in SHARED_MODELS]
    assert key("configs/quickstart.yaml", SMALL) == key("configs/quickstart.yaml", SMALL_MODEL)
    assert prebuilt == [
        key("configs/quickstart.yaml", SMALL),
        key("configs/quickstart.yaml", []),
        key("configs/gsm8k_format_cpu.yaml", ["generation.backend=torch"]),
    ]
    assert len(set(prebuilt)) == len(prebuilt)
