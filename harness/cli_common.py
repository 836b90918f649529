"""What every `harness` command shares: the consoles, the config argument and trial options,
and one-line errors (`fail`) for everything a user can fix.

The commands live in `harness.cli` (the app: config, plan, data, run, report, ui) and
`harness.cli_trial` (one trial and its component processes); both import this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from contract.trial import StalenessMode
from harness.config import ConfigError, ExperimentConfig, load_config

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


ConfigArg = Annotated[Path, typer.Argument(help="Experiment YAML, e.g. configs/quickstart.yaml.")]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Dotted overrides such as `learner.lr=1e-5 seeds=[0,1]`.", show_default=False
    ),
]


# Choices come from the contract's Literal, so a new mode needs no edit here.
ModeOpt = Annotated[StalenessMode, typer.Option("--mode", help="Staleness mode.")]
ArmOpt = Annotated[str, typer.Option("--arm", help="Arm name from the config's `arms`.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Trial seed.")]
LagOpt = Annotated[int, typer.Option("--lag", help="Lag (fixed) or max lag (bounded).")]
OutOpt = Annotated[Path, typer.Option("--out", help="Trial output directory.")]
StepsOpt = Annotated[
    int | None,
    typer.Option("--steps", min=1, help="Cap on learner steps (smoke runs).", show_default=False),
]


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a user-facing error and return the Exit to raise (the message is not markup: a
    `[...]` in it, a list of columns say, is printed as written)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def load_or_exit(config: Path, overrides: list[str] | None):
    try:
        return load_config(config, overrides or [])
    except ConfigError as exc:
        raise fail(str(exc)) from None


def check_inputs(cfg: ExperimentConfig) -> None:
    """Fail in one line, before any trial starts, when model.path or a task is unusable.

    Only what is cheap is checked: a user model directory's files and context length, the whole
    task file (read and split as the trial will), and that every eval set can be drawn (a
    procedural task's held-out problems are finite); the built-in model is built later, by the
    trial.
    """
    from harness.tasks.factory import held_out_prompts, make_task

    try:
        if cfg.model.path != "builtin":
            from harness.models.model_dir import check_model_context, validate_model_dir

            model_dir = validate_model_dir(Path(cfg.model.path).expanduser())
            check_model_context(model_dir, cfg.generation.max_new_tokens)
        # eval sets and mixture components too, each task once, named by where it is set
        tasks = {id(cfg.task): ("", cfg.task)}
        for name, _, task in cfg.train_components():
            tasks.setdefault(id(task), (f"train_tasks.{name}: ", task))
        for name, task in cfg.eval_sets():
            tasks.setdefault(id(task), (f"evals.{name}: ", task))
        for where, task in tasks.values():
            try:
                held_out_prompts(make_task(task), task)
            except ConfigError as exc:
                raise ConfigError(f"{where}{exc}") from None
    except ConfigError as exc:
        raise fail(str(exc)) from None


def check_out(out: str, option: str, command: str, *, uri_ok: bool) -> None:
    """The output rule every command shares (harness.storage.output), as a one-line error."""
    from harness.storage.output import check_output

    try:
        check_output(out, option=option, command=command, uri_ok=uri_ok)
    except ConfigError as exc:
        raise fail(str(exc)) from None
