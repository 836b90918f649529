"""Checkpoints restore weights, optimiser, scheduler and RNG states exactly."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from learner.runtime.checkpoint import MANIFEST_FORMAT, CheckpointStore, ResumeError, TrainingState
from learner.runtime.schedule import lr_multiplier


def _modules(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: lr_multiplier(u, 2, 10, "cosine"))
    return model, opt, sched


def _train(model, opt, sched, n: int) -> None:
    for _ in range(n):
        loss = model(torch.randn(5, 4)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def test_resume_continues_bit_for_bit(tmp_path: Path) -> None:
    model, opt, sched = _modules(0)
    _train(model, opt, sched, 3)
    store = CheckpointStore(tmp_path)
    state = TrainingState(step=3, updates=3, trained_group_ids=["a", "b"], grad_spikes=1)
    store.save(state, {"policy": model, "opt": opt, "sched": sched})
    # Uninterrupted: 3 more updates and RNG draws.
    _train(model, opt, sched, 3)
    expected = (model.weight.clone(), random.random(), np.random.rand(), torch.rand(1))  # noqa: NPY002

    resumed, opt2, sched2 = _modules(1)  # different init, overwritten by the load
    torch.manual_seed(123)  # a different RNG state, overwritten too
    loaded = store.load({"policy": resumed, "opt": opt2, "sched": sched2})
    assert loaded.step == 3 and loaded.trained_group_ids == ["a", "b"] and loaded.grad_spikes == 1
    _train(resumed, opt2, sched2, 3)
    got = (resumed.weight, random.random(), np.random.rand(), torch.rand(1))  # noqa: NPY002
    assert torch.equal(got[0], expected[0])
    assert got[1] == expected[1] and got[2] == expected[2]
    assert torch.equal(got[3], expected[3])
    assert sched2.get_last_lr() == sched.get_last_lr()


def test_latest_pointer_and_pruning(tmp_path: Path) -> None:
    model, _opt, _sched = _modules(0)
    store = CheckpointStore(tmp_path, keep=2)
    for step in (2, 4, 6):
        store.save(TrainingState(step=step), {"policy": model})
    assert store.latest_step() == 6
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000004", "step-000006"]


def test_lr_schedule_values() -> None:
    # warm-up of 4 updates: 1/4, 2/4, 3/4, 4/4; then constant.
    assert [lr_multiplier(u, 4, 10, "constant") for u in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    # cosine from 1.0 at the end of warm-up to 0.1 at the last update.
    assert lr_multiplier(0, 0, 10, "cosine") == 1.0
    assert abs(lr_multiplier(10, 0, 10, "cosine") - 0.1) < 1e-12
    assert abs(lr_multiplier(5, 0, 10, "cosine") - 0.55) < 1e-12  # 0.1 + 0.9 * 0.5


def test_manifest_holds_a_sha256_per_file_and_is_written_last(tmp_path: Path) -> None:
    model, _opt, _sched = _modules(0)
    part = tmp_path / "trial/metrics.parquet/part-000002.parquet"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"row of step 2")
    records = lambda step: {"metrics.parquet/part-000002.parquet": (2, part)}  # noqa: E731
    store = CheckpointStore(tmp_path / "trial/checkpoints", records=records)
    final = store.save(TrainingState(step=2), {"policy": model})
    manifest = json.loads((final / "manifest.json").read_text())
    state = (final / "state.pt").read_bytes()
    assert manifest["format"] == MANIFEST_FORMAT and manifest["step"] == 2
    assert manifest["files"] == {
        "state.pt": {"sha256": hashlib.sha256(state).hexdigest(), "bytes": len(state)}
    }
    assert manifest["records"] == {
        "metrics.parquet/part-000002.parquet": {
            "step": 2,
            "sha256": hashlib.sha256(b"row of step 2").hexdigest(),
        }
    }
    assert (final / "manifest.json").stat().st_mtime_ns >= (final / "state.pt").stat().st_mtime_ns
    assert sorted(p.name for p in final.iterdir()) == ["manifest.json", "state.pt"]


def test_a_checkpoint_without_a_valid_manifest_is_skipped(tmp_path: Path, capsys) -> None:
    model, _opt, _sched = _modules(0)
    store = CheckpointStore(tmp_path)
    for step in (2, 4):
        store.save(TrainingState(step=step), {"policy": model})
    (tmp_path / "step-000004/manifest.json").unlink()  # as a kill between rename and manifest
    assert store.latest_step() == 2
    assert store.load({"policy": model}, say=print).step == 2
    assert capsys.readouterr().out.splitlines() == [
        "checkpoint step-000004 skipped: it has no manifest.json (its save did not finish, or "
        "the manifest was lost)",
        "resuming from checkpoint step-000002 (latest.json names step-000004)",
    ]
    (tmp_path / "step-000002/manifest.json").write_text("{not json")
    assert store.latest_step() is None
    with pytest.raises(ResumeError, match=r"no intact checkpoint in .*step-000002: manifest\.json"):
        store.load({"policy": model})


def test_pruning_keeps_older_intact_checkpoints_over_newer_skipped_ones(tmp_path: Path) -> None:
    model, _opt, _sched = _modules(0)
    store = CheckpointStore(tmp_path, keep=2)
    for step in (2, 4):
        store.save(TrainingState(step=step), {"policy": model})
    (tmp_path / "step-000004/state.pt").unlink()  # skipped by the resume, which loads step 2
    store.save(TrainingState(step=3), {"policy": model})  # its first checkpoint after the resume
    assert sorted(p.name for p in tmp_path.glob("step-*")) == [
        "step-000002",
        "step-000003",
        "step-000004",
    ]
    assert store.latest_step() == 3


def test_an_invalid_seal_is_skipped_and_invalid_records_fail_the_resume(
    tmp_path: Path, capsys
) -> None:
    model, _opt, _sched = _modules(0)
    store = CheckpointStore(tmp_path)
    for step in (2, 4):
        store.save(TrainingState(step=step), {"policy": model})
    path = tmp_path / "step-000004/manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "step": 6}))  # another step's manifest
    assert store.load({"policy": model}, say=print).step == 2
    assert capsys.readouterr().out.splitlines()[0] == (
        f"checkpoint step-000004 skipped: manifest.json is not a valid {MANIFEST_FORMAT} "
        "manifest of step 4"
    )
    path = tmp_path / "step-000002/manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "records": {"a.json": {"step": "1"}}}))
    assert store.latest_step() == 2  # the seal is intact: the records are checked on resume
    with pytest.raises(ResumeError, match=r"step-000002/manifest\.json: its records are not valid"):
        store.verify_records(2, tmp_path)
