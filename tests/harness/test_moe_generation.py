"""MoE policies in both generator backends, and one end-to-end MoE trial.

The point of these tests is weight updates: vLLM 0.32's in-place reload leaves the CPU fused-MoE
experts in checkpoint layout where its kernel reads a prepacked one (logprobs ~10 nats off), so
every update is checked against a float32 transformers recompute of the *new* weights. The model
is a random Qwen3-MoE (8 experts, top-2, 2 layers, head size 32 for vLLM's CPU attention) with a
wide init, so routing and next-token distributions are far from uniform.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from buffer.weight_store import WeightStore
from contract import metrics as M
from harness.config import GenerationConfig
from harness.generators import SamplingSettings, make_generator
from harness.generators.sampling import max_logprob_gap
from harness.generators.torch_backend import TorchGenerator
from tests.harness.test_generators_torch import TOL, load_reference, perturbed_state, requests_for
from tests.tiny_models import CHAR_MOE, save_tiny_model_dir

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model_dir(tmp_path_factory.mktemp("moe"), CHAR_MOE)


@pytest.fixture(scope="module")
def versions(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Two updates as the learner publishes them (fused-expert state dicts, config copied)."""
    store = WeightStore(tmp_path_factory.mktemp("weights"))
    return [
        store.write(v, perturbed_state(model_dir, scale=0.1 * v), config_dir=model_dir)
        for v in (1, 2)
    ]


def gap_after(generator, location: str | Path, step: int) -> float:
    requests = requests_for(step=step)
    results = generator.generate(requests)
    return max_logprob_gap(load_reference(location), requests, results, SamplingSettings())


def test_torch_backend_moe_matches_a_recompute_before_and_after_updates(
    model_dir: Path, versions: list[str]
) -> None:
    generator = make_generator(GenerationConfig(backend="torch", threads=1), model_dir, seed=0)
    assert isinstance(generator, TorchGenerator)
    assert gap_after(generator, model_dir, step=0) < TOL
    generator.load_weights(1, versions[0])
    assert gap_after(generator, versions[0], step=1) < TOL
    # Back to the base directory, whose experts are saved per expert, not fused.
    generator.load_weights(0, str(model_dir))
    assert gap_after(generator, model_dir, step=2) < TOL


# ---- vLLM --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator:
    pytest.importorskip("vllm")
    cfg = GenerationConfig(backend="vllm", threads=1, cpu_kvcache_space_gb=1)
    made = make_generator(cfg, model_dir, seed=0)
    yield made
    made.close()


@pytest.mark.e2e
def test_vllm_moe_weight_updates_match_the_new_weights(
    engine, model_dir: Path, versions: list[str]
) -> None:
    assert engine.weight_update == "reload_repack"
    assert gap_after(engine, model_dir, step=0) < TOL
    for version, location in enumerate(versions, start=1):  # two updates in a row
        engine.load_weights(version, location)
        assert gap_after(engine, location, step=version) < TOL
    engine.load_weights(0, str(model_dir))  # per-expert checkpoint layout
    assert gap_after(engine, model_dir, step=3) < TOL


@pytest.mark.e2e
def test_vllm_moe_restart_path_serves_the_new_weights(engine, versions: list[str]) -> None:
    engine.weight_update = "restart"  # what an unverified vLLM / device / kernel gets
    try:
        seconds = engine.load_weights(2, versions[1])
        assert engine.version == 2 and seconds > 0
        assert gap_after(engine, versions[1], step=4) < TOL
    finally:
        engine.weight_update = "reload_repack"


class FakeLLM:
    """`apply_model` answers with fixed MoE layer tags (no engine needed)."""

    def __init__(self, tags: list[str]) -> None:
        self.tags = tags

    def apply_model(self, _func: object) -> list[list[str]]:
        return [self.tags]


def test_weight_update_plan_restarts_where_reload_is_unverified() -> None:
    pytest.importorskip("vllm")
    from harness.generators.vllm_moe_reload import CPU_PREPACKED, weight_update_plan

    assert weight_update_plan(FakeLLM([]), "cpu") == "reload"  # dense
    assert weight_update_plan(FakeLLM([CPU_PREPACKED] * 2), "cpu") == "reload_repack"
    assert weight_update_plan(FakeLLM([CPU_PREPACKED] * 2), "cuda") == "restart"
    unknown = [CPU_PREPACKED, "UnquantizedFusedMoEMethod/TritonExperts"]
    assert weight_update_plan(FakeLLM(unknown), "cpu") == "restart"


# ---- one end-to-end trial on the MoE config ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.e2e
def test_moe_trial_writes_finite_moe_metrics(tmp_path: Path) -> None:
    """Two steps of the GRPO + R3 routing replay arm of configs/moe_gspo_vs_grpo.yaml."""
    out = tmp_path / "trial"
    # A short warm start into a private cache keeps the build to seconds; 2 of the study's 8
    # layers and 2 of its 4 updates a step pin the same metrics at a quarter of the cost.
    overrides = [f"model.cache_dir={tmp_path / 'models'}", "model.warm_start_steps=20"]
    overrides += ["model.num_layers=2", "learner.minibatches=2"]
    command = [
        str(Path(sys.executable).with_name("harness")),
        "trial",
        str(REPO / "configs" / "moe_gspo_vs_grpo.yaml"),
        "--arm",
        "grpo_r3",
        "--seed",
        "0",
        "--lag",
        "0",
        "--out",
        str(out),
        "--steps",
        "2",
        *overrides,
    ]
    done = subprocess.run(
        command, check=False, cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parts = sorted(out.rglob("metrics.parquet"))
    assert parts, f"no metrics.parquet under {out}"
    table = ds.dataset(parts[0], format="parquet").to_table().to_pydict()
    steps = [i for i, step in enumerate(table[M.STEP]) if step >= 1]  # step 0 is the eval row
    assert len(steps) == 2
    logged = (M.MOE_LOAD_IMBALANCE, M.MOE_ROUTER_ENTROPY, M.MOE_ROUTING_CHANGE_FRAC)
    logged += (M.MOE_ROUTING_CHANGE_MAX, M.MOE_TOKEN_REROUTED_FRAC)
    for name in logged:
        values = [table[name][i] for i in steps]
        assert all(math.isfinite(v) for v in values), (name, values)
