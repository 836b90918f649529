"""The executor section of the experiment configuration: where a trial's components run.

Local subprocesses (pinned to CPU sets with `executor.cpu_sets`) or Ray actors with per-component
resources. Left out of the config hash (`harness.config.HASH_EXCLUDED`): where a trial runs
changes no result. Split from `harness.config.sections` (model, task, generation), one concern
per file; `harness.config` re-exports both.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.cpu_lists import format_cpu_list, parse_cpu_list

ExecutorKind = Literal["local", "ray"]
PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


class ComponentResources(BaseModel):
    """What one component (the learner, or one generator) asks Ray for: one placement bundle."""

    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(default=1.0, ge=0, description="Logical CPUs of the bundle.")
    gpus: float = Field(
        default=0.0,
        ge=0,
        description="GPUs of the bundle; Ray sets CUDA_VISIBLE_DEVICES for the component.",
    )
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources (`{node_a: 0.01}`): pin a component to nodes started "
        "with `ray start --resources '{\"node_a\": 1}'`.",
    )

    @model_validator(mode="after")
    def _check(self) -> ComponentResources:
        if not any(amount > 0 for amount in self.bundle().values()):
            raise ValueError(
                "a component's bundle asks for nothing (cpus=0, gpus=0, no resources): Ray "
                "rejects empty placement bundles; give it cpus > 0"
            )
        return self

    def bundle(self) -> dict[str, float]:
        """The placement-group bundle, zero amounts left out (Ray rejects them)."""
        asked = {"CPU": self.cpus, "GPU": self.gpus, **self.resources}
        return {name: amount for name, amount in asked.items() if amount > 0}


class CpuSets(BaseModel):
    """`executor.cpu_sets`: the CPUs each component of a trial may run on (kind=local).

    Why: on a shared machine the learner and the generators contend for the same cores, so
    `perf/learner_wait_frac` and `perf/gen_idle_frac` measure that contention, not how a
    disaggregated fleet (generators on their own nodes, the learner on its own) would be used.
    Disjoint sets model that fleet on one machine. Results do not change (each component sets
    its own thread count; fixed mode stays bitwise); only timings do.
    """

    model_config = ConfigDict(extra="forbid")

    learner: str = Field(
        description="The learner's CPUs, a CPU list as `taskset -c` takes it (`0`, `0-3`, "
        "`0-1,6`); every rank of learner_ranks > 1 shares it."
    )
    generators: list[str] = Field(
        min_length=1,
        description="One CPU list per generator (generation.num_generators of them, pairwise "
        "disjoint), or a single one that all generators share: several engines on one "
        "generator node, contending with each other as they would there, never with the "
        "learner. Partly overlapping per-generator sets model no fleet and are refused.",
    )

    @field_validator("learner", mode="before")
    @classmethod
    def _learner_list(cls, value: Any) -> Any:
        return _checked_cpu_list(value)

    @field_validator("generators", mode="before")
    @classmethod
    def _generator_lists(cls, value: Any) -> Any:
        if isinstance(value, str | int):  # `generators: "1"`: one set shared by all
            value = [value]
        if not isinstance(value, list):
            return value  # pydantic names the type error
        return [_checked_cpu_list(item) for item in value]

    @model_validator(mode="after")
    def _disjoint(self) -> CpuSets:
        learner = self.learner_cpus()
        for index, cpus in enumerate(self.generator_entries()):
            shared = learner & cpus
            if shared:
                raise ValueError(
                    f"generators[{index}]={self.generators[index]!r} shares CPUs "
                    f"{format_cpu_list(shared)} with learner={self.learner!r}: the sets must "
                    "be disjoint, or the learner and the generators contend for cores again"
                )
        entries = self.generator_entries()
        for i, first in enumerate(entries):
            for j in range(i + 1, len(entries)):
                shared = first & entries[j]
                if shared:
                    raise ValueError(
                        f"generators[{i}] and generators[{j}] share CPUs "
                        f"{format_cpu_list(shared)}: give each generator its own set, or one "
                        "set all generators share (a single entry)"
                    )
        return self

    def learner_cpus(self) -> frozenset[int]:
        return parse_cpu_list(self.learner)

    def generator_entries(self) -> list[frozenset[int]]:
        return [parse_cpu_list(entry) for entry in self.generators]

    def generator_cpus(self, num_generators: int) -> list[frozenset[int]]:
        """The CPUs of generators 0..num_generators-1; ValueError (naming the field) when the
        entries are neither one shared set nor one per generator."""
        entries = self.generator_entries()
        if len(entries) == 1:
            return entries * num_generators
        if len(entries) != num_generators:
            raise ValueError(
                f"executor.cpu_sets.generators has {len(entries)} CPU sets for "
                f"generation.num_generators={num_generators}: give one per generator, or a "
                "single set they all share"
            )
        return entries

    def all_cpus(self) -> frozenset[int]:
        return self.learner_cpus().union(*self.generator_entries())


def _checked_cpu_list(value: Any) -> Any:
    """A CPU list, as a string (a YAML `0` arrives as an int); ValueError if it is not one."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return value  # pydantic names the type error
    text = str(value).strip()
    parse_cpu_list(text)
    return text


class ExecutorConfig(BaseModel):
    """Where trials run. Not part of the config hash: an executor changes no result."""

    model_config = ConfigDict(extra="forbid")

    kind: ExecutorKind = Field(
        default="local",
        description="`local`: every trial and its components are subprocesses of `harness run`. "
        "`ray`: each trial's learner and generators are Ray actors in one placement group per "
        "trial (harness.executors.ray_components); the trial's supervisor and Redis stay on the "
        "driver's node.",
    )
    address: str | None = Field(
        default=None,
        description="kind=ray: the cluster's GCS address (`head:6379`, or `auto`). Unset: "
        "$RAY_ADDRESS, else a private local Ray instance is started for the launch and stopped "
        "with it. Ray Client (`ray://`) is refused: trials must run on a cluster node.",
    )
    placement_strategy: PlacementStrategy = Field(
        default="PACK",
        description="kind=ray: how a trial's bundles are placed (Ray's placement strategies): "
        "PACK fills few nodes, SPREAD puts components on different nodes where it can; the "
        "STRICT_ forms wait until they can be honoured exactly.",
    )
    learner_ranks: int = Field(
        default=1,
        gt=0,
        description="Learner processes of each trial. Above 1 the learner runs under `torchrun "
        "--standalone --nproc_per_node N` on one machine (local: the trial's; kind=ray: the "
        "node of the learner's bundle, which then needs executor.learner.gpus >= N on cuda): "
        "data-parallel ranks (learner.parallel: ddp replicates, fsdp shards), one per GPU on "
        "cuda, CPU processes with gloo on cpu. Each minibatch's groups must divide by it. "
        "Left out of the config hash like the rest of `executor`: an fsdp trial checkpointed "
        "by N ranks resumes with any other number (results agree to float rounding, not bit "
        "for bit).",
    )
    warm_components: bool = Field(
        default=True,
        description="kind=local: each of the `max_parallel` slots of `harness run` keeps its "
        "trial's component processes (the learner, each generator) across the trials it runs, "
        "so a trial pays neither the imports of torch, transformers and vLLM nor a vLLM "
        "engine's start again (the engine is put back on the trial's initial weights). "
        "Results are bitwise those of fresh processes. A learner of learner_ranks > 1 starts "
        "fresh each trial (torchrun); so does every component after a failed trial. "
        "`harness trial` always starts fresh processes (forked by a zygote its environment "
        "names, HARNESS_ZYGOTE).",
    )
    fork_components: bool = Field(
        default=True,
        description="kind=local: `harness run` keeps a zygote, a process that imports torch "
        "and transformers once and forks the warm components (warm_components: true) and every "
        "component start no warm process serves (all of them with warm_components: false; "
        "restarts), so none pays ~5 CPU-s of imports. Results are bitwise those of fresh "
        "processes. false: plain subprocesses. A zygote named in the environment "
        "(HARNESS_ZYGOTE) is used instead of starting one.",
    )
    learner: ComponentResources = Field(
        default_factory=ComponentResources, description="kind=ray: the learner's bundle."
    )
    generator: ComponentResources = Field(
        default_factory=ComponentResources, description="kind=ray: each generator's bundle."
    )
    max_trial_retries: int = Field(
        default=2,
        ge=0,
        description="kind=ray: how often a trial that lost a node is started again (resuming "
        "from its last checkpoint) before it counts as failed.",
    )
    start_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="kind=ray: seconds one component actor may take to start once its "
        "bundle is reserved (a worker process on its node).",
    )
    scratch_dir: str = Field(
        default="~/.cache/gspo-harness/work",
        description="output_dir is a URI (`s3://...`): where each machine keeps its working "
        "copies of trial directories (the driver's, and with kind=ray each component's own).",
    )
    sync_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="output_dir is a URI: how often progress (metrics, logs) is pushed to and "
        "pulled from the bucket. Checkpoints and weight versions are uploaded when written.",
    )
    cpu_sets: CpuSets | None = Field(
        default=None,
        description="kind=local: pin each trial's learner and generators to disjoint CPU sets "
        "(`{learner: '0', generators: ['1']}`), so that learner wait and generator idle measure "
        "a disaggregated fleet rather than two processes contending for the same cores. "
        "Checked against the CPUs this machine lends the run when a run or trial starts. "
        "Unset: no pinning.",
    )

    @model_validator(mode="after")
    def _check(self) -> ExecutorConfig:
        if self.address is not None and self.address.startswith("ray://"):
            raise ValueError(
                f"executor.address={self.address!r}: Ray Client addresses are not supported; "
                "run `harness run` on a cluster node (e.g. through `ray job submit`) and give "
                "the GCS address (host:6379) or `auto`"
            )
        if self.cpu_sets is not None and self.kind == "ray":
            raise ValueError(
                "executor.cpu_sets pins local processes and is for kind=local; with kind=ray "
                "give each component its own bundle (executor.learner.cpus, "
                "executor.generator.cpus, and custom resources to put them on different nodes): "
                "Ray reserves those CPUs for the actor but does not pin it to cores"
            )
        return self
