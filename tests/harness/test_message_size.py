"""buffer.max_message_bytes too small: refused up front when it must be, else fails the trial at
once with one line naming the field and the size needed (it used to crash-loop the generator)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from contract.record import read_trial_record
from harness.config import ConfigError, load_config
from tests.harness.trial_helpers import REPO, status, trial_command

QUICKSTART = REPO / "configs/quickstart.yaml"


def test_config_refuses_a_limit_below_a_full_length_groups_token_bytes() -> None:
    # quickstart: group_size 8, max_new_tokens 8 -> 8 * 8 * (4 + 4) bytes = 512 of token data.
    with pytest.raises(ConfigError, match=r"buffer\.max_message_bytes=511 .* = 512 "):
        load_config(QUICKSTART, ["buffer.max_message_bytes=511"])
    assert load_config(QUICKSTART, ["buffer.max_message_bytes=512"]).buffer.max_message_bytes == 512
    # generation.group_size=4, max_new_tokens=16 -> 4 * 16 * 8 = 512 again; 500 is below.
    small = ["generation.group_size=4", "generation.max_new_tokens=16"]
    with pytest.raises(ConfigError, match=r"generation\.group_size=4 x .*= 512 "):
        load_config(QUICKSTART, [*small, "buffer.max_message_bytes=500"])


@pytest.mark.e2e
def test_an_oversized_group_fails_the_trial_at_once_naming_the_limit(tmp_path: Path) -> None:
    """300 bytes passes the config floor (4 * 8 * 8 = 256 for the small trial) but no encoded
    group fits (Arrow framing alone is larger): the trial must fail on the first push with the
    generator's one-line reason, without restarting it (a restart makes the same group)."""
    result = subprocess.run(
        trial_command(tmp_path, "gspo", steps=2, extra=("buffer.max_message_bytes=300",)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,  # the old crash loop took 4 crashes and 3 lease waits of 120 s
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert status(tmp_path) == "failed"
    reason = read_trial_record(tmp_path).failure_reason
    assert reason is not None and "\n" not in reason
    found = re.search(r"encodes to (\d+) bytes, over buffer\.max_message_bytes=300; set "
                      r"buffer\.max_message_bytes to at least (\d+)", reason)  # fmt: skip
    assert found, reason
    assert int(found[1]) == int(found[2]) > 300
    assert reason.startswith("generator-0 failed: group ")
    assert reason in result.stdout.splitlines()  # printed whole, on one line
    log = (tmp_path / "logs" / "generator-0.log").read_text()
    assert "Traceback" not in log
    assert log.count("max_message_bytes=300") == 1  # not restarted
