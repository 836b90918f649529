"""Partial rollouts in the torch generator (`staleness.partial_rollouts`; vLLM's in
tests/harness/test_generators_vllm.py): with a newer version
published while it decodes, the generator loads it between tokens and continues the same
responses. Each token's recorded version is the one that sampled it, and its behaviour log-prob
is exactly what the learner computes for that token under that version's weights, read back
from the weight store (a real redis-server holds the version registry)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from buffer.connection import RunKeys
from buffer.rewind import rewind_bounded
from buffer.schema import decode_group, encode_group
from buffer.versions import VersionRegistry
from buffer.weight_store import WeightStore
from contract import metrics as M
from contract.layout import TrialPaths
from harness.config import load_config
from harness.experiment.trial_runs import read_rollouts
from harness.generators.base import GenRequest
from harness.generators.torch_backend import TorchGenerator
from harness.trial.weight_updates import TEST_CHECK_DELAY_ENV, PublishedUpdates
from learner.algorithms.sampling_dist import SamplingSettings
from learner.runtime.forward import policy_logprobs
from learner.runtime.models import load_causal_lm
from tests.harness.trial_helpers import REPO, metrics, run_argv, trial_command
from tests.learner.tiny import save_tiny_policy, tiny_policy

EOS, PAD = 1, 0
SAMPLING = SamplingSettings(temperature=0.9, top_p=1.0, top_k=0)
CHECK = 3  # look for newer weights every 3 tokens
STEPS = 6


def _two_versions(tmp_path: Path, client) -> tuple[Path, WeightStore, VersionRegistry]:
    """v0 = the tiny policy; v1 = another tiny policy's weights (so every logit moves)."""
    model_dir = save_tiny_policy(tmp_path / "model")
    store = WeightStore(tmp_path / "weights")
    versions = VersionRegistry(client, "partial")
    versions.publish(0, str(store.write(0, tiny_policy(0).state_dict(), config_dir=model_dir)))
    versions.publish(1, str(store.write(1, tiny_policy(7).state_dict(), config_dir=model_dir)))
    return model_dir, store, versions


def _rescored(store: WeightStore, version: int, prompt: list[int], tokens: list[int]) -> list:
    """The learner's log-probs of `tokens` after `prompt` under `version`'s stored weights."""
    model = load_causal_lm(store.path(version)).eval()
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logprobs, _ = policy_logprobs(model, ids, torch.ones_like(ids), SAMPLING)
    return logprobs[0, len(prompt) :].tolist()


def test_responses_continue_under_the_newer_version_with_its_logprobs(
    redis_server, tmp_path: Path
) -> None:
    model_dir, store, versions = _two_versions(tmp_path, redis_server.client())
    generator = TorchGenerator(
        model_dir, sampling=SAMPLING, eos_token_id=EOS, pad_token_id=PAD, threads=1
    )
    assert generator.version == 0  # started on v0; v1 is already published
    updates = PublishedUpdates(versions, sync_every=1, check_tokens=CHECK)
    prompt = [5, 6, 7]
    requests = [GenRequest(prompt, seeds=list(range(12)), max_new_tokens=8)]
    (result,) = generator.generate(requests, updates)
    assert updates.switches == 1 and generator.version == 1
    spanning = 0
    for tokens, logprobs, versions_of in zip(
        result.response_ids, result.behavior_logprobs, result.token_versions, strict=True
    ):
        # Tokens before the first check come from v0, every later one from v1.
        assert versions_of == [0 if t < CHECK else 1 for t in range(len(tokens))]
        spanning += len(set(versions_of)) == 2
        for version in set(versions_of):
            want = _rescored(store, version, prompt, tokens)
            for t, v in enumerate(versions_of):
                if v == version:
                    assert abs(logprobs[t] - want[t]) < 1e-5, (t, v, logprobs[t], want[t])
    assert spanning >= 6  # most of the 12 responses outlive the switch at token 3
    # Without `updates` the same generator (now at v1) samples every token from v1.
    (plain,) = generator.generate(requests)
    assert plain.token_versions is None


def test_a_check_costs_no_round_trip_and_a_lost_announcement_is_read_within_reread_s(
    redis_server,
) -> None:
    """Between publishes a check reads only the announcements already on its socket (no GET);
    a publish is seen through its announcement; a version whose announcement was lost (set in
    the registry without one) is found when the registry is read again."""
    client = redis_server.client()
    versions = VersionRegistry(client, "checks")
    versions.publish(0, "at-0")
    updates = PublishedUpdates(versions, sync_every=1, check_tokens=1, reread_s=3600.0)
    assert updates.newer(0) is None  # the first check subscribes, then reads the registry

    def gets() -> int:
        return int(client.info("commandstats").get("cmdstat_get", {}).get("calls", 0))

    before = gets()
    assert all(updates.newer(0) is None for _ in range(200))
    assert gets() == before  # 200 checks, not one GET
    versions.publish(1, "at-1")
    deadline = time.monotonic() + 5
    while (found := updates.newer(0)) is None and time.monotonic() < deadline:
        time.sleep(0.001)  # the announcement is on its way
    assert found == (1, "at-1")
    keys = RunKeys("checks")
    client.set(keys.version, 2)  # published, its announcement lost
    client.hset(keys.version_locations, 2, "at-2")
    assert updates.newer(1) is None  # not announced, and the registry read is not due
    updates.reread_s = 0.0
    assert updates.newer(1) == (2, "at-2")
    # A bounded-mode rewind to v1 withdraws v2 (its location goes): the next check neither
    # fails nor loads it, and the learner's new v2 is found by the registry read after it.
    rewind_bounded(client, "checks", 1, [])
    updates.reread_s = 3600.0
    assert updates.newer(1) is None
    client.set(keys.version, 2)
    client.hset(keys.version_locations, 2, "at-2-again")
    assert updates.newer(1) == (2, "at-2-again")
    updates.close()


def test_a_spanning_group_travels_with_its_versions(redis_server, tmp_path: Path) -> None:
    """The generator's group: policy_version is the start, each token keeps its own version,
    and schema v3 carries them through the buffer's encoding."""
    from buffer.rollout_group import RolloutGroup
    from tests.buffer.factories import CREATED_AT

    model_dir, _, versions = _two_versions(tmp_path, redis_server.client())
    generator = TorchGenerator(
        model_dir, sampling=SAMPLING, eos_token_id=EOS, pad_token_id=PAD, threads=1
    )
    updates = PublishedUpdates(versions, sync_every=1, check_tokens=2)
    (result,) = generator.generate([GenRequest([4, 9], seeds=[3, 4], max_new_tokens=6)], updates)
    group = RolloutGroup(
        run_id="partial",
        group_id="s0-b0-p0",
        prompt_index=0,
        prompt_ids=[4, 9],
        response_ids=result.response_ids,
        behavior_logprobs=result.behavior_logprobs,
        rewards=[0.0, 1.0],
        reward_infos=["{}", "{}"],
        finish_reasons=result.finish_reasons,
        policy_version=0,
        generator_id="gen-0",
        created_at=CREATED_AT,
        token_versions=result.token_versions,
    )
    back = decode_group(encode_group(group))
    assert [v.tolist() for v in back.versions_per_token()] == result.token_versions
    assert back.newest_token_version == (1 if any(len(r) > 2 for r in result.response_ids) else 0)


@pytest.mark.e2e
def test_a_partial_rollout_trial_logs_spanning_responses_each_token_scored_by_its_version(
    tmp_path: Path,
) -> None:
    """A bounded lag-1 trial with partial rollouts (its arm's own regime) on the vLLM generator
    (the torch generator's run in the bounded fault-injection trial, which sets the experiment's
    staleness.partial_rollouts, tests/harness/test_fault_injection.py): it
    completes, its rollout log holds responses whose tokens span two versions, and every logged
    token's behaviour log-prob is the learner's log-prob of it under its recorded version, read
    back from the weight store. The test slows each check for new weights
    (TEST_CHECK_DELAY_ENV) so versions reliably arrive mid-response on the tiny model."""
    out = tmp_path / "trial"
    extra = (
        "staleness.mode=bounded",
        # the arm's own regime (`arms[].staleness`); the fault-injection trial sets the
        # experiment's staleness.partial_rollouts
        "arms.grpo.staleness.partial_rollouts=true",
        "learner.keep_versions=20",  # every version stays in the store to be re-scored
        "evals=[]",
        "eval.samples=0",
        "eval.pass_k=[]",
    )
    result = run_argv(
        trial_command(out, "grpo", steps=STEPS, lag=1, mode="bounded", backend="vllm", extra=extra),
        env={**os.environ, TEST_CHECK_DELAY_ENV: "0.02"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    logged = read_rollouts(out).to_pandas()
    assert len(logged) == STEPS * 4 * 4  # every trained sample (SMALL: 4 prompts x 4)
    spans = logged["token_versions"].apply(lambda v: len(set(v)) > 1)
    assert spans.sum() >= 4, logged["token_versions"].tolist()
    store = WeightStore(TrialPaths(out).weights)
    sampling = load_config(out / "resolved_config.yaml").generation.sampling()
    models = {v: load_causal_lm(store.path(v)).eval() for v in store.versions()}
    for row in logged.itertuples():
        prompt, tokens = list(row.prompt_ids), list(row.response_ids)
        ids = torch.tensor([prompt + tokens])
        for version in set(row.token_versions):
            with torch.no_grad():
                want, _ = policy_logprobs(models[version], ids, torch.ones_like(ids), sampling)
            want = want[0, len(prompt) :].tolist()
            for t, v in enumerate(row.token_versions):
                if v == version:
                    assert abs(row.behavior_logprobs[t] - want[t]) < 1e-4, (row.group_id, t, v)
    frame = metrics(out)
    assert (frame[M.STALENESS_SPANNING_FRAC].iloc[1:] > 0).any()


def test_partial_rollouts_are_refused_by_name_in_fixed_mode() -> None:
    """The experiment's staleness.mode, and a single trial's --mode, must be bounded."""
    import typer

    from harness.cli_trial import _trial_spec
    from harness.config import ConfigError

    quickstart = REPO / "configs/quickstart.yaml"
    torch_partial = ["generation.backend=torch", "staleness.partial_rollouts=true"]
    with pytest.raises(ConfigError, match=r"staleness\.partial_rollouts needs staleness\.mode"):
        load_config(quickstart, torch_partial)  # the quickstart is fixed mode
    # both generators continue responses (the quickstart's is vLLM)
    vllm = load_config(quickstart, ["staleness.mode=bounded", "staleness.partial_rollouts=true"])
    assert vllm.generation.backend == "vllm" and vllm.staleness.partial_rollouts
    cfg = load_config(quickstart, ["staleness.mode=bounded", *torch_partial])
    with pytest.raises(typer.Exit):
        _trial_spec(cfg, "grpo", 0, 1, "fixed")
    assert _trial_spec(cfg, "grpo", 0, 1, "bounded").mode == "bounded"
    with pytest.raises(ConfigError, match=r"staleness\.partial_check_tokens"):
        load_config(quickstart, ["staleness.partial_check_tokens=0"])
