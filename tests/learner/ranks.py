"""Run a test's worker on WORLD gloo CPU ranks, as torchrun would, and say why a rank died.

A rank that dies inside C++ (gloo, FSDP2's collectives, a `std::terminate`) leaves only
"process 0 terminated with signal SIGABRT" in `mp.spawn`'s exception: its own message went to a
stderr that pytest captures and shows truncated. So each rank here writes its stderr (Python's and
C++'s: file descriptor 2 itself) to `ranks/rank-N.log` in the run's directory, with a
`faulthandler` dump of every thread's Python stack should a fatal signal arrive, and a failed
run's exception starts with the dead rank, how it died and the tail of its log.

A finished rank leaves with `os._exit(0)` once its results are on disk and the process group is
destroyed: the tests compare those results, and interpreter finalisation (destructors of gloo
and FSDP state, in whatever order the collector reaches them) is not what they test.

A rank killed by a signal (not a Python exception: an assertion or a mismatch is never retried)
gets one more run of the whole group on a fresh port, with the first run's diagnosis printed as
a warning, so a one-off crash of the CPU backend on a loaded 2-core machine does not hide what
the tests check; a second death fails with both diagnoses.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

from learner.runtime.distributed import DistContext, init_distributed

WORLD = 2
LOG_TAIL_LINES = 30
LOGS_DIR = "ranks"
Worker = Callable[[int, int, Path, Path], None]


def join_cpu_rank(rank: int, port: int) -> DistContext:
    """In a spawned process: join the WORLD-rank gloo group as torchrun would, one thread."""
    os.environ |= {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(WORLD),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
    }
    torch.set_num_threads(1)
    return init_distributed("cpu")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log_path(logs: Path, rank: int) -> Path:
    return logs / f"rank-{rank}.log"


def _rank_main(rank: int, worker: Worker, port: int, model_dir: Path, out: Path) -> None:
    """One rank: stderr and fatal-signal stacks to its log, the worker, then a prompt exit."""
    log = _log_path(out / LOGS_DIR, rank).open("a", buffering=1)
    os.dup2(log.fileno(), 2)
    faulthandler.enable(log, all_threads=True)
    worker(rank, port, model_dir, out)
    print(f"rank {rank}: worker finished", file=log)
    log.close()
    os._exit(0)


def _diagnosis(error: ProcessExitedException, logs: Path) -> str:
    """'rank R died (how)' and the last lines of its log."""
    rank = error.error_index
    how = f"signal {error.signal_name}" if error.signal_name else f"exit code {error.exit_code}"
    path = _log_path(logs, rank)
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    tail = "\n".join(line for line in lines[-LOG_TAIL_LINES:] if line.strip())
    return f"rank {rank} died ({how}); the end of {path}:\n{tail or '(empty)'}"


def spawn_ranks(worker: Worker, model_dir: Path, root: Path) -> Path:
    """`worker(rank, port, model_dir, out)` on WORLD ranks, out a new directory under root;
    returns out. One rerun, in a directory of its own, after a rank's fatal signal (module
    docstring); a Python exception in a rank is raised as it is."""
    diagnoses = []
    for attempt in (1, 2):
        out = root / f"run-{attempt}"
        logs = out / LOGS_DIR
        logs.mkdir(parents=True)
        args = (worker, free_port(), model_dir, out)
        try:
            mp.spawn(_rank_main, args=args, nprocs=WORLD, join=True)
            return out
        except ProcessRaisedException:
            raise
        except ProcessExitedException as error:
            diagnoses.append(_diagnosis(error, logs))
            if attempt == 1:
                warnings.warn(f"rerunning the ranks once: {diagnoses[0]}", stacklevel=2)
    heads = "; ".join(diagnosis.split(";")[0] for diagnosis in diagnoses)
    raise RuntimeError("\n\n".join([f"the ranks died twice: {heads}", *diagnoses]))
