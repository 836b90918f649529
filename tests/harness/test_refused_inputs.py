"""Inputs that used to crash, hang or write where they should not (issue #30): each is now one
line naming the field or option, a non-zero exit, and nothing written.

Also here: `--resume` with a changed config is refused by name without touching the trial
directory; a learner killed before it logs is not blamed on the previous attempt's error; and
every file a trial or an experiment writes is 0600 in 0700 directories.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from contract.layout import TrialPaths
from contract.record import TrialRecord, write_trial_record
from contract.trial import TrialStatus
from harness.config import load_config, resolved_dump
from harness.launch.processes import Child
from harness.trial.watch import _learner_finished
from tests.harness.test_input_errors import one_line_error
from tests.harness.trial_helpers import REPO, SMALL_MODEL

# A small valid config of its own (the shipped ones change with the experiments they run): each
# test breaks one field of it with an override. Two eval sets, the second with its own task.
CONFIG_TEXT = """
name: refused
seeds: [0]
arms:
  - {name: gspo, objective: gspo}
model: {path: builtin}
task: {name: addition, digits: 2, eval_size: 64}
evals:
  - name: addition2
  - name: addition2_q
    task: {name: addition, digits: 2, eval_size: 64, system_prompt: "q"}
eval: {samples: 4, pass_k: [1, 4]}
generation: {backend: torch, num_generators: 1, group_size: 4, max_new_tokens: 8}
staleness: {mode: fixed, lags: [0]}
learner: {steps: 2, prompts_per_step: 4, lr: 1.0e-4, eval_every: 2, checkpoint_every: 2}
buffer: {max_depth: 64}
report: {n_resamples: 200, curve_resamples: 200}
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("config") / "refused.yaml"  # not under a test's tmp_path
    path.write_text(CONFIG_TEXT)
    return str(path)


def trial_args(config: str, out: str | Path, seed: str = "0") -> list[str]:
    return ["trial", config, "--arm", "gspo", "--seed", seed, "--lag", "0", "--out", str(out)]


def snapshot(root: Path) -> dict[str, tuple[bytes | None, int, int]]:
    """Every path under `root`: (bytes of a file, mtime_ns, mode)."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        data = path.read_bytes() if path.is_file() else None
        found[str(path.relative_to(root))] = (data, info.st_mtime_ns, info.st_mode)
    return found


@pytest.mark.timeout(60)
def test_negative_seed(config: str, tmp_path: Path) -> None:
    line = one_line_error(trial_args(config, tmp_path / "t", seed="-1"))
    assert line == "error: --seed must be >= 0, got -1"
    line = one_line_error(["run", config, "--out", str(tmp_path / "r"), "seeds=[1,-1]"])
    assert "seeds" in line and "-1" in line and ">= 0" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_config_file_that_is_not_utf8(config: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"# caf\xe9\n" + Path(config).read_bytes())
    expected = f"error: config file {bad} is not UTF-8 text (byte 0xe9 at offset 5)"
    for args in (
        trial_args(str(bad), tmp_path / "t"),
        ["run", str(bad), "--out", str(tmp_path / "r")],
    ):
        assert one_line_error(args) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


@pytest.mark.timeout(60)
def test_out_that_is_a_file(config: str, tmp_path: Path) -> None:
    target = tmp_path / "results"
    target.write_text("keep me")
    for args in (trial_args(config, target), ["run", config, "--out", str(target)]):
        line = one_line_error(args)
        assert line == f"error: --out {target} is a file, not a directory"
    under = target / "trial"  # a path through a file cannot be made either
    line = one_line_error(trial_args(config, under))
    assert line == f"error: --out {under}: {target} is a file, not a directory"
    assert target.read_text() == "keep me" and sorted(tmp_path.iterdir()) == [target]


@pytest.mark.timeout(60)
def test_eval_size_beyond_the_held_out_problems_fails_fast(config: str, tmp_path: Path) -> None:
    """2-digit addition holds out 965 problems: 2000 cannot be drawn, and 1e6 used to hang."""
    for command in (
        trial_args(config, tmp_path / "t"),
        ["run", config, "--out", str(tmp_path / "r")],
    ):
        for size in ("2000", "1000000"):
            line = one_line_error([*command, f"task.eval_size={size}"])
            assert line.startswith(f"error: task.eval_size={size} is more than the ")
            assert "held-out problems of task addition (digits=2)" in line
        line = one_line_error([*command, "evals.addition2_q.task.eval_size=5000"])
        assert line.startswith("error: evals.addition2_q: task.eval_size=5000 is more than the ")
    assert list(tmp_path.iterdir()) == []


def _fake_model_dir(root: Path, max_positions: int) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"max_position_embeddings": max_positions}))
    (root / "tokenizer.json").write_text("{}")
    return root


@pytest.mark.timeout(60)
def test_max_new_tokens_beyond_the_context(config: str, tmp_path: Path) -> None:
    line = one_line_error([*trial_args(config, tmp_path / "t"), "generation.max_new_tokens=64"])
    assert "generation.max_new_tokens=64 must be below the model's context" in line
    assert "model.max_seq_len=64" in line
    model = _fake_model_dir(tmp_path / "model", max_positions=32)
    for command in (
        trial_args(config, tmp_path / "t"),
        ["run", config, "--out", str(tmp_path / "r")],
    ):
        line = one_line_error([*command, f"model.path={model}", "generation.max_new_tokens=40"])
        assert line == (
            "error: generation.max_new_tokens=40 must be below the model's context, "
            f"max_position_embeddings=32 in {model / 'config.json'} (prompt + response); lower "
            "generation.max_new_tokens"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["../../escape", "a/b", "..", ".", "", "a\\b", "a\x01b", " a"])
def test_experiment_name_must_be_one_safe_path_component(
    config: str, tmp_path: Path, name: str
) -> None:
    override = f"name={json.dumps(name)}"  # a YAML double-quoted string, escapes and all
    line = one_line_error(["config", "show", config, override])
    assert line.startswith("error: invalid configuration: name: ") and repr(name) in line
    runs = tmp_path / "a" / "b"
    line = one_line_error(["run", config, f"output_dir={runs}", override])
    assert line.startswith("error: invalid configuration: name: ")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_trial_out_uri_is_refused_without_echoing_credentials(
    config: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to make a local directory `s3:` and hand the secret to components in argv."""
    monkeypatch.chdir(tmp_path)
    line = one_line_error([*trial_args(config, "s3://KEY:SECRET@bucket/p"), "--steps", "1"])
    assert line == (
        "error: --out s3://bucket/p is a URI: harness trial writes a local directory; for "
        "output in a bucket run `harness run --out s3://bucket/p`"
    )
    assert list(tmp_path.iterdir()) == []


def _killed_trial(config: str, root: Path, overrides: list[str]) -> None:
    """What a killed attempt leaves: resolved config, a `running` record, a checkpoint."""
    cfg = load_config(config, overrides)
    paths = TrialPaths(root)
    root.mkdir()
    paths.resolved_config.write_text(yaml.safe_dump(resolved_dump(cfg), sort_keys=False))
    record = TrialRecord(
        arm="gspo", seed=0, lag=0, mode="fixed", status=TrialStatus.RUNNING,
        config_hash=cfg.config_hash(), steps_planned=50, steps_completed=10,
    )  # fmt: skip
    write_trial_record(root, record)
    (paths.checkpoints / "step-000010").mkdir(parents=True)
    (paths.checkpoints / "step-000010" / "state.pt").write_bytes(b"weights")


@pytest.mark.timeout(60)
def test_resume_with_a_changed_config_is_refused_by_name(config: str, tmp_path: Path) -> None:
    from harness.trial.prepare import check_resume_config

    trial = tmp_path / "t"
    _killed_trial(config, trial, ["learner.lr=1e-4", "seeds=[0]"])
    before = snapshot(tmp_path)
    line = one_line_error(
        [*trial_args(config, trial), "--resume", "learner.lr=5e-4", "eval.samples=8"]
    )
    assert line.startswith(f"error: --resume: trial gspo__seed0__lag0__fixed in {trial} ran ")
    assert "changed: eval.samples 4 -> 8, learner.lr 0.0001 -> 0.0005;" in line
    assert snapshot(tmp_path) == before  # nothing written, not even rewritten with equal bytes
    # seeds, executor and max_parallel are not part of the hash: a resume may change them
    same = load_config(config, ["learner.lr=1e-4", "seeds=[0,1]", "max_parallel=3"])
    check_resume_config(same, TrialPaths(trial), "gspo__seed0__lag0__fixed")


def test_learner_killed_before_logging_is_not_blamed_on_the_last_attempt(tmp_path: Path) -> None:
    log = TrialPaths(tmp_path).component_log("learner")
    first = Child("learner", [sys.executable, "-c", "print('error: old reason'); exit(2)"], log)
    first.start()
    first.process.wait()
    assert first.last_line() == "error: old reason"
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    second = Child("learner", killed, log)
    second.start()
    code = second.process.wait()
    assert second.last_line() == "" and second.tail() == ""
    outcome = _learner_finished(code, second, TrialPaths(tmp_path))
    assert outcome.reason is not None and "old reason" not in outcome.reason
    assert outcome.reason.startswith("learner exited with code -9; resume with --resume")
    first.start()  # a restarted component (generators) reads its own attempt too
    first.process.wait()
    assert first.last_line() == "error: old reason"
    assert log.read_text().count("old reason") == 2  # the log itself keeps every attempt


@pytest.mark.slow
@pytest.mark.e2e
def test_every_file_of_a_finished_experiment_is_private(config: str, tmp_path: Path) -> None:
    """One finished 1-step trial under `harness run` (MLflow store, report, Redis, logs,
    checkpoints, weights, Parquet): every file 0600, every directory 0700. On the end-to-end
    tests' built-in model (SMALL_MODEL), which the session builds once for them all."""
    out = tmp_path / "exp"
    args = ["run", config, "--out", str(out), "--steps", "1", *SMALL_MODEL]
    result = subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    names = {p.name for p in out.rglob("*")}
    assert {"mlflow.db", "trial.json", "prompts.parquet", "state.pt", "report.html"} <= names
    modes = {out: stat.S_IMODE(out.stat().st_mode)}
    modes |= {p: stat.S_IMODE(p.lstat().st_mode) for p in out.rglob("*") if not p.is_symlink()}
    wrong = {
        str(p.relative_to(out)): oct(mode)
        for p, mode in modes.items()
        if mode != (0o700 if p.is_dir() else 0o600)
    }
    assert wrong == {}
