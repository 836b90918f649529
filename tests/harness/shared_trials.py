"""Finished trials built once per test session and shared by every test that only reads them.

A whole trial costs 15-40 s on 2 cores, most of it start-up (three Python processes importing
torch and transformers, a Redis, a model load), whatever its few steps. So each distinct
end-to-end configuration that tests merely inspect is run once, by the session fixtures of
tests/harness/conftest.py, and every such test reads the same directory. A test that changes a
trial (resumes it, breaks its AOF, kills a component) works on `private_copy` of it, never on
the shared directory; the session fails at its end if a shared directory was written to. The
same holds for the finished experiments (`harness run`) some tests compare against.

A shared run may also serve a test that runs fewer steps of the same configuration: in fixed
mode with the default constant learning rate, the first k steps of a longer trial are bitwise
those of a k-step trial (`assert_same_metrics(..., steps=k)`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.config import load_config, load_config_data
from harness.file_lock import file_lock
from tests.harness.trial_helpers import REPO, SMALL, SMALL_FIXED, run_argv, trial_command

# Evals reduced to the primary greedy set (no sampled scores): a trial that pins mechanics,
# not eval suites, has nothing to gain from the others.
NO_EVALS = ("evals=[]", "eval.samples=0", "eval.pass_k=[]")
# How long a test worker waits for another one running the same shared recipe.
SHARED_RUN_WAIT_S = 1800


@dataclass(frozen=True)
class Recipe:
    """One `harness trial` configuration (tests/harness/trial_helpers.SMALL plus `extra`)."""

    arm: str
    steps: int
    lag: int = 0
    mode: str = "fixed"
    backend: str = "torch"
    extra: tuple[str, ...] = ()

    def command(self, out: Path, *, steps: int | None = None, resume: bool = False) -> list[str]:
        """Its argv into `out`: the recipe's configuration, `steps` (default its own) steps."""
        return trial_command(
            out,
            self.arm,
            steps=steps or self.steps,
            lag=self.lag,
            mode=self.mode,
            backend=self.backend,
            resume=resume,
            extra=self.extra,
        )

    def run(
        self, out: Path, *, steps: int | None = None, resume: bool = False
    ) -> subprocess.CompletedProcess:
        return run_argv(self.command(out, steps=steps, resume=resume))


# GRPO, 2 steps at lag 0 (checkpoint at 2), primary greedy eval only: copied and broken by
# test_trial_failures; test_trial_evals' trial without eval sets.
GRPO_TWO_STEPS = Recipe("grpo", steps=2, extra=NO_EVALS)
# GRPO at fixed lag 1, 80 steps: test_fault_injection's uninterrupted reference, and through
# its first 4 steps test_trial's.
GRPO_LAG1 = Recipe("grpo", steps=80, lag=1)


@dataclass(frozen=True)
class Experiment:
    """One `harness run` on the local executor: the quickstart with `overrides`."""

    overrides: tuple[str, ...]
    steps: int
    max_parallel: int

    def run(self, root: Path) -> None:
        """Into `root/out`, its config written to `root/exp.yaml`."""
        from harness.experiment.run import (  # what collecting tests need not load
            ExperimentRequest,
            run_experiment,
        )

        root.mkdir(parents=True)
        config = root / "exp.yaml"
        data = load_config_data(REPO / "configs/quickstart.yaml", list(self.overrides))
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        request = ExperimentRequest(
            load_config(config), config, root / "out", (), self.max_parallel, self.steps
        )
        done = run_experiment(request, report=False)
        assert done.exit_code == 0, [(t.spec.trial_name, t.status, t.message) for t in done.trials]


# GSPO at lag 0 (SMALL_FIXED), seeds 0 and 1 at once, 4 steps, output on a plain path:
# test_bucket_output's reference (seed 0), and through its first 2 steps test_ray_executor's
# local run that the Ray executor must match. With fresh component processes per trial
# (executor.warm_components off): the one `harness run` of the suite that starts them cold,
# every other one keeps them warm.
GSPO_TWO_SEEDS = Experiment(
    (
        *SMALL_FIXED,
        "arms=[{name: gspo, objective: gspo}]",
        "seeds=[0, 1]",
        "executor.warm_components=false",
    ),
    steps=4,
    max_parallel=2,
)


def pinned_cpu_sets() -> tuple[str, ...]:
    """`executor.cpu_sets` putting the learner on the first CPU this process may use and the
    generator on the second; none on a machine that lends fewer than 2."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return ()
    return (f"executor.cpu_sets={{learner: '{cpus[0]}', generators: ['{cpus[1]}']}}",)


# The vLLM generator's experiment: every objective (GSPO, GRPO, PPO with its critic, GSPO-token)
# at fixed lag 0 and GRPO at lag 1 too (an arm's own `staleness.lags`), 2 steps each (SMALL,
# both eval sets), one trial at a time in one slot of warm component processes: the first trial
# starts the slot's vLLM engine, the other four keep it (reset to the initial weights).
# test_trial reads the arms' trials; test_warm_components the kept engine; and both compare its
# GRPO lag-1 trial with a cold `harness trial` of the same configuration (VLLM_GRPO_LAG1), bit
# for bit. Their evals run on the vLLM engine (`eval.engine: generator`): its greedy and seeded
# sampling, between rollout rounds. Its learner and generator are pinned to disjoint CPUs
# (executor.cpu_sets, on 2 or more CPUs), re-pinned at each of the five trials of their warm
# processes: test_cpu_sets reads that; pinning changes no result, so the cold, unpinned trial
# still matches bit for bit.
VLLM_ARMS = Experiment(
    (
        *SMALL,
        "generation.backend=vllm",
        # every objective at lag 0; GRPO at lag 1 too, where the generator runs a batch ahead
        # (the other arms' lag-1 trials pinned nothing the GRPO one does not)
        "arms=[{name: gspo, objective: gspo, staleness: {lags: [0]}}, "
        "{name: grpo, objective: grpo}, {name: ppo, objective: ppo, staleness: {lags: [0]}}, "
        "{name: gspo_token, objective: gspo_token, staleness: {lags: [0]}}]",
        "seeds=[0]",
        "staleness.lags=[0, 1]",
        "tracking.enabled=false",
        "eval.engine=generator",  # the evals on the vLLM engine itself, as on GPUs
        *pinned_cpu_sets(),
    ),
    steps=2,
    max_parallel=1,
)
VLLM_GRPO_LAG1 = Recipe("grpo", steps=2, lag=1, backend="vllm", extra=("eval.engine=generator",))


def private_copy(finished: Path, out: Path) -> Path:
    """A copy of a finished trial that a test may resume or break (the shared one stays)."""
    shutil.copytree(finished, out, symlinks=True)
    for pid_file in (out / "logs").glob("*.pid"):  # the finished trial's dead processes
        pid_file.unlink()
    return out


def fingerprint(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root`: (size, mtime_ns); any write to the tree changes it."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        found[str(path.relative_to(root))] = (info.st_size, info.st_mtime_ns)
    return found


class SharedTrials:
    """Runs each recipe the first time a test asks for it; remembers what it handed out.

    Under pytest-xdist every worker has its own session, so the recipes live in a folder all
    workers share (`root`), one directory per recipe named by its digest: the first worker to
    ask runs it under a file lock, the others wait for the lock and read the same directory. A
    failed run leaves its reason next to it, and every later user fails at once instead of
    running it again.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.finished: dict[Hashable, Path] = {}
        self.prints: dict[Hashable, dict[str, tuple[int, int]]] = {}

    def trial(self, recipe: Recipe) -> Path:
        """The finished trial directory of `recipe`."""

        def make(out: Path) -> None:
            done = recipe.run(out)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

        return self._once(recipe, make)

    def experiment(self, experiment: Experiment) -> Path:
        """The finished experiment's output directory (`trials/<name>/` under it)."""
        return self._once(experiment, experiment.run) / "out"

    def _once(self, key: Hashable, make: Callable[[Path], None]) -> Path:
        """Make `key` on first use in any worker; a failed one fails every later user at once."""
        if key not in self.finished:
            root = self.root / hashlib.sha256(repr(key).encode()).hexdigest()[:16]
            failed, done = root.with_suffix(".failed"), root.with_suffix(".done")
            with file_lock(root.with_suffix(".lock"), SHARED_RUN_WAIT_S, "another test worker"):
                if failed.exists():
                    raise AssertionError(f"the shared run failed earlier: {failed.read_text()}")
                if not done.exists():  # made where it stays: runs record absolute paths
                    shutil.rmtree(root, ignore_errors=True)  # a run killed half-way
                    try:
                        make(root)
                    except BaseException as exc:
                        failed.write_text(f"{key}: {exc}"[:3000])
                        raise
                    done.touch()
            self.finished[key], self.prints[key] = root, fingerprint(root)
        return self.finished[key]

    def changed(self) -> list[str]:
        """Shared trials some test wrote to (it should have taken a `private_copy`)."""
        return [
            str(out) for key, out in self.finished.items() if fingerprint(out) != self.prints[key]
        ]
