"""The `harness` command line. Each command is short: parse, call an importable function, report.

Errors the user can fix (bad config, missing model or task file, unreadable task data, missing
trial, unreachable Redis) exit non-zero with one line naming the field or file; tracebacks are kept
for bugs. Every such error is a ConfigError (or a subclass: ModelPathError, TaskFileError), so each
command needs one `except ConfigError`.

The commands that run one trial and its components are in `harness.cli_trial`; what every
command shares (consoles, arguments, `fail`) is in `harness.cli_common`.

Each command imports what it runs inside its own body: `harness --help` and a config error answer
without loading torch, vLLM, Ray or matplotlib. None of these imports hides a cycle
(`tests/contract/test_dependencies.py` counts them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
import yaml

from harness.cli_common import (
    ConfigArg,
    OverridesArg,
    StepsOpt,
    check_inputs,
    check_out,
    console,
    fail,
    load_or_exit,
)
from harness.cli_trial import generator, learner, trial
from harness.config import ConfigError, resolved_dump

app = typer.Typer(
    help="A reproducible comparison harness for RL algorithms on language models "
    "(GSPO, GSPO-token, GRPO variants, PPO).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect experiment configurations.", no_args_is_help=True)
app.add_typer(config_app, name="config")
data_app = typer.Typer(help="Generate task data files locally.", no_args_is_help=True)
app.add_typer(data_app, name="data")

PRIVATE_UMASK = 0o077  # files 0600, directories 0700


@app.callback()
def private_files() -> None:
    # Runs before every command. Everything a command writes is private, files 0600 and
    # directories 0700: trial directories hold prompts, responses, weights and Redis data, and
    # the libraries that write much of it (SQLite for MLflow, pyarrow, torch, redis-server)
    # create files with the umask's mode, so one umask covers them all. Components are
    # `python -m harness.cli learner|generator ...`, so they set it too, wherever an executor
    # starts them (design section 9). No docstring: it would replace the app's help.
    os.umask(PRIVATE_UMASK)


@config_app.command("show")
def config_show(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Print the resolved configuration (defaults filled, overrides applied) as YAML."""
    resolved = load_or_exit(config, overrides)
    console.print(yaml.safe_dump(resolved_dump(resolved), sort_keys=False), end="")
    console.print(f"# config hash: {resolved.config_hash()}", style="dim")


@app.command()
def plan(
    config: ConfigArg,
    gpu_memory: Annotated[
        str,
        typer.Option(
            "--gpu-memory",
            help="Memory of each GPU with its unit: 80GB (10^9 bytes), 80GiB, 81920MiB; or a "
            "GPU by name, as much as it reports: H100-80GB (81,559 MiB), A100-80GB, A100-40GB, "
            "H200, L40S.",
            show_default=False,
        ),
    ],
    gpus: Annotated[
        int, typer.Option("--gpus", min=1, help="GPUs the learner runs on (its ranks).")
    ] = 1,
    model_config: Annotated[
        Path | None,
        typer.Option(
            "--model-config",
            help="A Hugging Face config.json to plan for instead of model.path's (a model "
            "that is not downloaded, e.g. configs/model_configs/qwen2.5-7b.json).",
            show_default=False,
        ),
    ] = None,
    prompt_tokens: Annotated[
        int | None,
        typer.Option(
            "--prompt-tokens",
            min=1,
            help="Longest prompt in tokens; default: the built-in model's context less "
            "max_new_tokens, else 256.",
            show_default=False,
        ),
    ] = None,
    headroom: Annotated[
        float,
        typer.Option(
            "--headroom",
            min=0.0,
            max=0.9,
            help="Share of each GPU kept free (CUDA context, NCCL, allocator fragmentation).",
        ),
    ] = 0.1,
    overrides: OverridesArg = None,
) -> None:
    """Estimate a learner step's memory per GPU for the config's most demanding arm."""
    from harness.planning.plan import parse_size, plan_experiment
    from harness.planning.render import describe, table, verdict

    cfg = load_or_exit(config, overrides)
    try:
        memory = parse_size(gpu_memory, "--gpu-memory")
        result = plan_experiment(
            cfg,
            gpus=gpus,
            gpu_memory=memory,
            headroom=headroom,
            model_config=model_config,
            prompt_tokens=prompt_tokens,
        )
    except ConfigError as exc:
        raise fail(str(exc)) from None
    for line in describe(result, gpu_memory):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(table(result))
    style = "green" if result.fits else "bold red"
    lines = verdict(result, gpu_memory, headroom)
    console.print(lines[0], style=style, highlight=False, soft_wrap=True)
    for line in lines[1:] + [f"note: {note}" for note in result.notes]:
        console.print(line, highlight=False, soft_wrap=True)


@data_app.command("gsm8k-format")
def data_gsm8k_format(
    out: Annotated[Path, typer.Argument(help="Parquet file to write.")],
    seed: Annotated[int, typer.Option("--seed", help="Seed of the problems.")] = 0,
    train_size: Annotated[int, typer.Option("--train-size", help="Training rows.")] = 2000,
    test_size: Annotated[int, typer.Option("--test-size", help="Held-out test rows.")] = 128,
    max_operand: Annotated[int, typer.Option("--max-operand", help="Largest operand.")] = 9,
) -> None:
    """Write GSM8K-format word problems (`#### N` answers) in verl's Parquet columns."""
    from harness.tasks.gsm8k_format import write_gsm8k_format

    try:
        frame = write_gsm8k_format(
            out, seed=seed, train_size=train_size, test_size=test_size, max_operand=max_operand
        )
    except (ValueError, OSError) as exc:  # bad sizes, or `out` cannot be written
        raise fail(str(exc)) from None
    console.print(f"wrote {len(frame)} rows to {out}", highlight=False)


# One trial and its component processes (`harness.cli_trial`), where `--help` lists them.
app.command()(trial)
app.command()(learner)
app.command()(generator)


def executor_overrides(executor: str | None, address: str | None) -> list[str]:
    """`--executor ray --address host:6379` -> `executor.kind=ray`, `executor.address=...`."""
    extra = [] if executor is None else [f"executor.kind={executor}"]
    return extra + ([] if address is None else [f"executor.address={address}"])


@app.command()
def run(
    config: ConfigArg,
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            help="Experiment output dir, or a URI (s3://bucket/prefix); default "
            "<output_dir>/<name>.",
        ),
    ] = None,
    max_parallel: Annotated[
        int | None, typer.Option("--max-parallel", help="Trials at once; default from config.")
    ] = None,
    steps: StepsOpt = None,
    executor: Annotated[
        str | None,
        typer.Option(
            "--executor",
            help="Where trials run: `local` or `ray` (executor.kind; default from config).",
            show_default=False,
        ),
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            help="Ray cluster address (executor.address); default $RAY_ADDRESS, else a local "
            "Ray instance.",
            show_default=False,
        ),
    ] = None,
    overrides: OverridesArg = None,
) -> None:
    """Run the matched comparison: arms x seeds x lags, MLflow tracking, then the report."""
    from mlflow.exceptions import MlflowException

    from harness.experiment.grid import TrialStateError
    from harness.experiment.run import ExperimentLockedError, ExperimentRequest, run_experiment
    from harness.storage.remote_tree import StorageError

    # The flags are overrides, so every trial resolves the executor the experiment resolved.
    overrides = [*(overrides or []), *executor_overrides(executor, address)]
    cfg = load_or_exit(config, overrides)
    if out is not None:
        check_out(out, "--out", "harness run", uri_ok=True)
    else:  # <output_dir>/<name>, as run_experiment resolves it
        from harness.storage.output import is_uri

        default = cfg.output_dir if is_uri(cfg.output_dir) else str(Path(cfg.output_dir) / cfg.name)
        check_out(default, "output_dir/name", "harness run", uri_ok=True)
    check_inputs(cfg)
    request = ExperimentRequest(cfg, config, out, overrides, max_parallel, steps)
    try:
        if cfg.tuning is not None:  # tune every arm on an equal budget, then compare
            from harness.experiment.tuning import run_tuned_experiment

            result = run_tuned_experiment(request, console=console)
        else:
            result = run_experiment(request, console=console)
    except (
        ConfigError,
        TrialStateError,
        ExperimentLockedError,
        MlflowException,
        StorageError,
    ) as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(result.exit_code)


@app.command()
def report(
    source: Annotated[
        str, typer.Argument(help="An experiment output dir, or an MLflow experiment name.")
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="Report dir; default <dir>/report.")
    ] = None,
    tracking_uri: Annotated[
        str | None,
        typer.Option("--tracking-uri", help="MLflow URI when SOURCE is an experiment name."),
    ] = None,
) -> None:
    """Rebuild the statistical report from an output dir or from MLflow."""
    from analysis import build_report, build_report_from_mlflow

    path = Path(source)
    if path.exists():
        result = build_report(path, out)
    else:
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise fail(
                f"{source!r} is not a directory; to read an MLflow experiment pass "
                "--tracking-uri or set MLFLOW_TRACKING_URI"
            )
        result = build_report_from_mlflow(uri, source, out or Path("report") / source)
    if result.software_note:
        console.print(f"[yellow]warning:[/] {result.software_note}", highlight=False)
    console.print(f"report: {result.markdown_path}\nhtml:   {result.html_path}", highlight=False)


@app.command()
def ui(
    source: Annotated[
        str, typer.Argument(help="Experiment output dir (with mlflow.db) or a tracking URI.")
    ] = "runs/quickstart",
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1.")] = 5000,
) -> None:
    """Serve the MLflow UI for an experiment on 127.0.0.1."""
    from harness.experiment.mlflow_ui import UiError, serve_ui

    try:
        raise typer.Exit(serve_ui(source, port, console=console))
    except UiError as exc:
        raise fail(str(exc)) from None


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
