"""The eval-suite and training-mixture sections of the experiment configuration.

`evals` names the sets every eval scores (each a full TaskConfig: its own prompts, rendering,
verifier and eval_size), `eval` says how each set is scored (greedy, plus k samples per prompt
at the generation temperature with unbiased pass@k, Chen et al. 2021), and `train_tasks` turns
the training stream into a weighted mixture of tasks. All three are optional: without them an
experiment trains on `task` and evaluates `task`'s held-out split greedily, as it always has.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contract.evals import DEFAULT_EVAL_SET, EVAL_SET_NAME_PATTERN
from harness.config.sections import TaskConfig


class EvalSetConfig(BaseModel):
    """One eval set: a name and the task whose held-out split it scores."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=EVAL_SET_NAME_PATTERN,
        description="Name of the set ([a-z0-9_]+, unique): the `eval_set` column of "
        "evals.parquet and the middle of its MLflow keys (`eval/<name>/greedy_pass_rate`).",
    )
    task: TaskConfig | None = Field(
        default=None,
        description="The set's task: its first task.eval_size held-out prompts, rendered and "
        "scored by its own verifier (or reward_fn). Omitted: the experiment's `task`.",
    )


EvalEngine = Literal["torch", "generator"]


class EvalConfig(BaseModel):
    """How every eval set is scored, every learner.eval_every steps (by a generator: the
    learner requests the evals of a published version and records what comes back)."""

    model_config = ConfigDict(extra="forbid")

    samples: int = Field(
        default=0,
        ge=0,
        description="Samples drawn per prompt at generation.temperature (with its top_p and "
        "top_k), for the sampled pass@1 and pass@k; 0 = greedy only (the default, no extra "
        "cost). Seeds come from (trial seed, step, eval set, prompt, sample): matched across arms "
        "and bitwise reproducible on CPU. Costs samples x eval_size decoded rows per set.",
    )
    pass_k: list[int] = Field(
        default_factory=list,
        description="k values of the unbiased pass@k (Chen et al. 2021) reported per set; each "
        "1 <= k <= eval.samples. pass@1 equals pass1_sampled; pass@samples is the share of "
        "prompts with any correct sample.",
    )
    engine: Literal["auto", "torch", "generator"] = Field(
        default="auto",
        description="Where the generators run the evals of each published version. `torch`: a "
        "float32 torch copy of the model in the generator process, the arithmetic the learner's "
        "evals always had (bitwise the same scores on CPU). `generator`: the rollout engine "
        "itself, with the version loaded (vLLM: its greedy and seeded sampling; no second copy "
        "of the policy anywhere). `auto`: torch when generation.device is cpu, else generator.",
    )

    def engine_on(self, device: str) -> EvalEngine:
        """The engine `auto` means for generators on `device`."""
        if self.engine != "auto":
            return self.engine
        return "torch" if device == "cpu" else "generator"

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        if len(set(self.pass_k)) != len(self.pass_k):
            raise ValueError(f"eval.pass_k={self.pass_k} has duplicates")
        bad = [k for k in self.pass_k if not 1 <= k <= self.samples]
        if bad:
            raise ValueError(
                f"eval.pass_k={self.pass_k}: k={bad[0]} is outside [1, eval.samples="
                f"{self.samples}]; pass@k needs at least k samples per prompt, so raise "
                "eval.samples or drop that k"
            )
        return self


class TrainTaskConfig(BaseModel):
    """One component of the training mixture."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None,
        pattern=EVAL_SET_NAME_PATTERN,
        description="Name recorded in prompts.parquet's `task` column ([a-z0-9_]+, unique); "
        "default: task.name.",
    )
    weight: float = Field(
        gt=0,
        description="Relative weight: the share of prompts drawn from this task is "
        "weight / sum of weights.",
    )
    task: TaskConfig = Field(description="The task, scored by its own verifier (or reward_fn).")

    @property
    def label(self) -> str:
        return self.name or self.task.name


def resolve_eval_sets(evals: list[EvalSetConfig], task: TaskConfig) -> list[tuple[str, TaskConfig]]:
    """(name, task) of every eval set, the primary one first; `task`'s split if none is named."""
    if not evals:
        return [(DEFAULT_EVAL_SET, task)]
    return [(entry.name, entry.task or task) for entry in evals]


def resolve_train_tasks(
    train_tasks: list[TrainTaskConfig], task: TaskConfig
) -> list[tuple[str, float, TaskConfig]]:
    """(name, weight, task) of every training component; `task` alone (weight 1) if none."""
    if not train_tasks:
        return [(task.name, 1.0, task)]
    return [(entry.label, entry.weight, entry.task) for entry in train_tasks]


def check_unique_names(evals: list[EvalSetConfig], train_tasks: list[TrainTaskConfig]) -> None:
    """Eval-set names and mixture names must each be unique (they key rows and MLflow metrics)."""
    for field, names, advice in (
        ("evals", [entry.name for entry in evals], ""),
        ("train_tasks", [entry.label for entry in train_tasks], " (default: task.name; set name)"),
    ):
        seen: dict[str, int] = {}
        for index, name in enumerate(names):
            if name in seen:
                raise ValueError(
                    f"{field}.{index}.name={name!r} repeats {field}.{seen[name]}.name; names "
                    f"must be unique{advice}"
                )
            seen[name] = index
