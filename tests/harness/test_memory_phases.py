"""benchmarks/memory_phases.py, what the GPU memory checks of `harness plan` read: each phase's
own peak (a nested phase's moment is its own, not its parent's) and the replay of an allocator
trace to the moment live bytes peak, with what is alive then by allocation site."""

from __future__ import annotations

import torch

from benchmarks import memory_phases
from benchmarks.memory_phases import OPTIMIZER, phase_peaks, replay_peak, site_of


class FakeMemory:
    """A peak the test moves by hand: `use(n)` holds n bytes more, `free(n)` less."""

    def __init__(self) -> None:
        self.now = self.high = 0

    def use(self, n: int) -> None:
        self.now += n
        self.high = max(self.high, self.now)

    def free(self, n: int) -> None:
        self.now -= n

    def reset_peak(self) -> None:
        self.high = self.now

    def peak(self) -> int:
        return self.high


class Step:
    """Stands in for a phase's owner: `run` makes 50 bytes, steps an optimizer, frees them."""

    def __init__(self, memory: FakeMemory, optimizer: torch.optim.Optimizer) -> None:
        self.memory, self.optimizer = memory, optimizer

    def run(self) -> None:
        self.memory.use(50)
        self.memory.free(50)
        self.memory.use(10)
        self.optimizer.step()  # 100 bytes inside (the hook below), none after
        self.memory.free(10)


def test_a_phase_peak_leaves_out_the_phases_nested_in_it(monkeypatch):
    memory = FakeMemory()
    memory.use(1000)  # the state
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.ones(2)
    optimizer = torch.optim.SGD([param], lr=0.1)

    def inside_the_step(*_: object) -> None:
        memory.use(100)
        memory.free(100)

    handle = optimizer.register_step_pre_hook(inside_the_step)
    monkeypatch.setattr(memory_phases, "PHASES", {"train": (Step, "run")})
    with phase_peaks(memory, sync=lambda: None) as peaks:
        Step(memory, optimizer).run()
    handle.remove()
    assert peaks == {"train": 1050, OPTIMIZER: 1110}
    assert Step.run.__name__ == "run"  # restored


def test_the_replay_finds_the_peak_and_what_is_alive_then():
    fsdp = [
        {
            "filename": "/x/site-packages/torch/distributed/fsdp/_fully_shard/c.py",
            "line": 59,
            "name": "allocate",
        },
        {
            "filename": "/x/site-packages/torch/distributed/fsdp/_fully_shard/g.py",
            "line": 9,
            "name": "reduce",
        },
    ]
    trace = [
        {"action": "alloc", "addr": 1, "size": 10, "frames": []},  # autograd's engine
        {"action": "free_completed", "addr": 99, "size": 4},  # older than the trace
        {"action": "alloc", "addr": 2, "size": 5, "frames": fsdp},
        {"action": "free_requested", "addr": 1, "size": 10},  # a stream still uses it
        {"action": "alloc", "addr": 3, "size": 2, "frames": []},
        {"action": "free_completed", "addr": 1, "size": 10},
        {"action": "alloc", "addr": 4, "size": 6, "frames": []},
    ]
    above, freed_old, alive, at = replay_peak(trace)
    assert (above, freed_old, at) == (13, 4, 4)  # 10 - 4 + 5 + 2, at the third alloc
    assert alive == {1: (10, "?"), 2: (5, site_of(fsdp)), 3: (2, "?")}
    assert site_of(fsdp) == "torch/distributed/fsdp/_fully_shard/c.py:59 allocate < reduce"
