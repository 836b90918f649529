"""Checkpoints restore weights, optimiser, scheduler and RNG states exactly."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from learner.runtime.checkpoint import CheckpointStore, TrainingState
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
