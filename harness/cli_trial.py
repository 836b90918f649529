"""`harness trial`, `harness learner`, `harness generator`: one trial, and the component
processes its supervisor starts (`python -m harness.cli learner|generator ...`).

`harness.cli` registers these commands on its app; they share its helpers (`cli_common`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from buffer.staleness import POLICIES
from contract.trial import StalenessMode, TrialSpec
from harness.cli_common import (
    ArmOpt,
    ConfigArg,
    LagOpt,
    ModeOpt,
    OutOpt,
    OverridesArg,
    SeedOpt,
    StepsOpt,
    check_inputs,
    check_out,
    console,
    fail,
    load_or_exit,
)
from harness.config import ConfigError, ExperimentConfig


def _trial_spec(
    cfg: ExperimentConfig, arm: str, seed: int, lag: int, mode: StalenessMode
) -> TrialSpec:
    """The trial the options name; --mode is already one of STALENESS_MODES (typer checks)."""
    try:
        cfg.arm(arm)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    if seed < 0:  # it seeds numpy's SeedSequence, which takes no negative numbers
        raise fail(f"--seed must be >= 0, got {seed}")
    if lag < 0:
        raise fail(f"--lag must be >= 0, got {lag}")
    if cfg.regime(arm).partial_rollouts and not POLICIES[mode].partial_rollouts:
        raise fail(
            f"--mode fixed with partial rollouts (arm {arm!r}'s regime, from staleness."
            "partial_rollouts or the arm's own staleness): partial rollouts are bounded mode's "
            "(fixed mode generates each batch with exactly one version); pass --mode bounded"
        )
    return TrialSpec(arm=arm, seed=seed, lag=lag, mode=mode)


@dataclass(frozen=True)
class _Component:
    """What a learner or generator process starts from: the resolved config, its trial, and
    the Redis and run id its supervisor handed it through the environment."""

    cfg: ExperimentConfig
    spec: TrialSpec
    redis_url: str
    run_id: str


def _component(
    config: Path, overrides: list[str] | None, arm: str, seed: int, lag: int, mode: StalenessMode
) -> _Component:
    """Load and check what both component commands are given, or exit with one line."""
    cfg = load_or_exit(config, overrides)
    spec = _trial_spec(cfg, arm, seed, lag, mode)
    url, run_id = os.environ.get("HARNESS_REDIS_URL", ""), os.environ.get("HARNESS_RUN_ID", "")
    if not url or not run_id:
        raise fail(
            "HARNESS_REDIS_URL and HARNESS_RUN_ID must be set (the trial runner sets them; "
            "to run a component alone, point them at your Redis and the run's id)"
        )
    return _Component(cfg, spec, url, run_id)


def trial(
    config: ConfigArg,
    arm: ArmOpt,
    seed: SeedOpt,
    lag: LagOpt,
    # A string, not a Path: Path("s3://k:s@b/p") is the local path "s3:/k:s@b/p"; check_out
    # refuses a URI (and any path that cannot be a directory) before anything is written.
    out: Annotated[str, typer.Option("--out", help="Trial output directory (a local path).")],
    mode: ModeOpt = "fixed",
    steps: StepsOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue a killed trial.")] = False,
    overrides: OverridesArg = None,
) -> None:
    """Run one trial: embedded Redis (unless configured), generator(s) and learner processes."""
    from contract.layout import TrialPaths
    from harness.trial.prepare import check_resume_config
    from harness.trial.supervisor import TrialFailedError, run_trial

    cfg = load_or_exit(config, overrides)
    spec = _trial_spec(cfg, arm, seed, lag, mode)
    check_out(out, "--out", "harness trial", uri_ok=False)
    check_inputs(cfg)
    try:
        if resume:  # before the supervisor's lock or any file: a refusal leaves the dir as is
            check_resume_config(cfg, TrialPaths(Path(out)), spec.name)
        outcome = run_trial(cfg, spec, Path(out), steps=steps, resume=resume)
    except (TrialFailedError, ConfigError) as exc:
        raise fail(str(exc)) from None
    style = {"completed": "green", "diverged": "yellow"}.get(outcome.status, "red")
    console.print(
        f"[{style}]{spec.name}: {outcome.status}[/] after {outcome.steps_completed} steps"
    )
    if outcome.reason:  # not wrapped: a one-line reason stays one line for grep and logs
        console.print(escape(outcome.reason), highlight=False, soft_wrap=True)
    code = 1 if outcome.status == "failed" else 0
    # The outcome is recorded and every child stopped: skip the interpreter's teardown. Ray's
    # exit hooks would wait a minute for a GCS that is gone, and unloading torch and vLLM took
    # 10-15 s on a loaded machine, which `harness run` (and a user) waited out after the fact.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def learner(
    config: ConfigArg,
    arm: ArmOpt,
    seed: SeedOpt,
    lag: LagOpt,
    out: OutOpt,
    mode: ModeOpt = "fixed",
    steps: StepsOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Resume from the checkpoint.")] = False,
    overrides: OverridesArg = None,
) -> None:
    """Run one learner against a Redis URL ($HARNESS_REDIS_URL) and run id ($HARNESS_RUN_ID)."""
    from buffer.versions import InitialWeightsMismatchError
    from contract.layout import TrialPaths
    from harness.trial.learner_main import run_learner_component

    c = _component(config, overrides, arm, seed, lag, mode)
    try:
        run_learner_component(
            c.cfg, c.spec, TrialPaths(out), redis_url=c.redis_url, run_id=c.run_id, steps=steps,
            resume=resume,
        )  # fmt: skip
    except (ConfigError, InitialWeightsMismatchError) as exc:
        raise fail(str(exc)) from None


def generator(
    config: ConfigArg,
    arm: ArmOpt,
    seed: SeedOpt,
    lag: LagOpt,
    out: OutOpt,
    mode: ModeOpt = "fixed",
    steps: StepsOpt = None,
    generator_id: Annotated[
        str | None,
        typer.Option("--id", help="Unique generator id; default: host name and process id."),
    ] = None,
    overrides: OverridesArg = None,
) -> None:
    """Run one rollout generator against $HARNESS_REDIS_URL / $HARNESS_RUN_ID until done."""
    import socket

    from harness.launch.processes import EXIT_NO_RESTART
    from harness.trial.generator_main import GeneratorFatalError, run_generator_component

    generator_id = generator_id or f"{socket.gethostname()}-{os.getpid()}"
    c = _component(config, overrides, arm, seed, lag, mode)
    try:
        run_generator_component(
            c.cfg,
            c.spec,
            redis_url=c.redis_url,
            run_id=c.run_id,
            generator_id=generator_id,
            steps=steps,
            trial_dir=out,  # generators write only Redis; weights are fetched here from a bucket
        )
    except (GeneratorFatalError, ConfigError) as exc:  # a restart would fail the same way
        raise fail(str(exc), code=EXIT_NO_RESTART) from None
