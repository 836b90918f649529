"""A full disk told in one line, whatever the writer that hit it says, and recorded even then."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from contract.layout import TrialPaths
from contract.record import (
    TrialRecord,
    read_trial_record,
    rewrite_trial_record_in_place,
    write_trial_record,
)
from contract.trial import TrialStatus
from harness.trial import supervisor
from harness.trial.disk_space import DiskFullError, disk_full_as_one_line, is_disk_full
from harness.trial.watch import TrialOutcome


def _raised_from(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as exc:
        return exc
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        # safetensors quotes the OS error's text in an exception of its own
        RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
        _raised_from(OSError(errno.ENOSPC, "full"), RuntimeError("checkpoint save failed")),
    ],
)
def test_a_full_disk_is_recognised_whatever_the_writer_says(tmp_path: Path, error) -> None:
    assert is_disk_full(error, tmp_path)
    with pytest.raises(DiskFullError) as raised, disk_full_as_one_line(tmp_path):
        raise error
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"no space left on device under {tmp_path}, ")
    assert "bytes free" in message and "rerun the trial with --resume" in message


def test_other_errors_pass_unchanged(tmp_path: Path) -> None:
    assert not is_disk_full(RuntimeError("file write failed"), tmp_path)  # space is left here
    with pytest.raises(KeyError), disk_full_as_one_line(tmp_path):
        raise KeyError("no")
    with (
        pytest.raises(ValueError, match="one line"),
        disk_full_as_one_line(tmp_path, keep=(ValueError,)),
    ):
        raise ValueError(f"one line about {errno.ENOSPC} and No space left on device")


def _record(**update) -> TrialRecord:
    record = TrialRecord(arm="grpo", seed=0, lag=0, mode="fixed", status=TrialStatus.RUNNING)
    return record.model_copy(update=update)


def test_the_record_is_rewritten_in_place_when_no_new_file_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The atomic write needs a new file, which a full disk refuses; the supervisor then
    rewrites trial.json in the blocks it holds, so the trial does not stay `running`."""
    write_trial_record(tmp_path, _record(steps_planned=4))

    def full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(supervisor, "write_trial_record", full)
    ending = supervisor._Ending(TrialPaths(tmp_path), read_trial_record(tmp_path))
    ending.record(TrialOutcome(TrialStatus.FAILED, 2, "no space left on device under x"))
    record = read_trial_record(tmp_path)
    assert record is not None and record.status == TrialStatus.FAILED
    assert record.failure_reason == "no space left on device under x"
    assert record.steps_completed == 2 and record.steps_planned == 4


def test_an_in_place_rewrite_that_would_need_more_blocks_touches_nothing(tmp_path: Path) -> None:
    write_trial_record(tmp_path, _record())
    before = (tmp_path / "trial.json").read_bytes()
    with pytest.raises(OSError, match="the record needs more"):
        rewrite_trial_record_in_place(tmp_path, _record(failure_reason="x" * 100_000))
    assert (tmp_path / "trial.json").read_bytes() == before
