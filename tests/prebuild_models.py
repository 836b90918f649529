"""Build the built-in models the suite's tests share, ahead of the tests that need them.

On a machine whose model cache (~/.cache/gspo-harness/models) is empty, the suite builds three
models: SMALL_MODEL (~6 s), the quickstart's (~35-60 s) and the Mistral-vocabulary model of
configs/gsm8k_format_cpu.yaml (~2 minutes). Each build runs on one thread inside the first test
that needs it, and a second test needing it waits on the build's lock, so on 2 cores a new
machine's suite took ~4 minutes longer than one with the models cached. Meanwhile the Ray
executor's tests, handed out first, mostly wait on Ray and leave a core idle for minutes.

`tests/conftest.py` starts this module (niced) beside a full parallel run: it builds the models
through the same `build_model_dir` and cache lock as the tests, in the order they are first
needed, so a test finds its model built or waits for the build already under way; nothing is
built twice and no result changes (a build is a pure function of its cache key). Run alone
(`python -m tests.prebuild_models`) it fills the cache and prints where each model is.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from harness.config import load_config
from harness.models.model_dir import build_model_dir
from tests.harness.trial_helpers import SMALL_MODEL

REPO = Path(__file__).resolve().parents[1]

# (config, overrides) of each shared model, in the order the suite first needs them: SMALL_MODEL
# by most end-to-end tests (fault injection, trials) from the first minute; the quickstart as
# shipped by test_learning, the eval and staleness-regime tests; the Mistral-vocabulary model by
# test_gsm8k_format_cpu_config_end_to_end alone.
SHARED_MODELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("configs/quickstart.yaml", tuple(SMALL_MODEL)),
    ("configs/quickstart.yaml", ()),
    ("configs/gsm8k_format_cpu.yaml", ()),
)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """The suite ended first: leave through `finally`, so a half-built model's staging
    directory is removed and its lock released."""
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    for config, overrides in SHARED_MODELS:
        cfg = load_config(REPO / config, list(overrides))
        print(f"{config} {' '.join(overrides)}: {build_model_dir(cfg.model, cfg.task)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
