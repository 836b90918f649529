"""The rollout log's format (contract.rollout_log): a part round-trips through the step tables
with every column typed as documented, and the rules that pick the logged steps and groups."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from contract import rollout_log as R
from contract import step_tables


def _columns(step: int) -> dict[str, list[object]]:
    """Two samples of one group; awkward text on purpose (a newline, markup, a pipe)."""
    return {
        R.STEP: [step, step],
        R.GROUP_ID: ["s0-b1-p3", "s0-b1-p3"],
        R.PROMPT_INDEX: [3, 3],
        R.SAMPLE_INDEX: [0, 1],
        R.POLICY_VERSION: [1, 1],
        R.LAG: [step - 2, step - 2],
        R.PROMPT_IDS: [[5, 6, 7], [5, 6, 7]],
        R.RESPONSE_IDS: [[8, 9], []],
        R.PROMPT_TEXT: ["12+3=\n", "12+3=\n"],
        R.RESPONSE_TEXT: ["<b>15</b> | x", None],
        R.REWARD: [1.0, 0.0],
        R.FINISH_REASON: ["stop", "length"],
        R.BEHAVIOR_LOGPROBS: [[-0.5, -0.25], []],
        R.TOKEN_VERSIONS: [[1, 1], []],
    }


def test_a_part_round_trips_with_the_documented_types(tmp_path: Path) -> None:
    root = tmp_path / "rollouts.parquet"
    for step in (2, 3):
        step_tables.write_part(root, step, R.rollout_table(_columns(step)))
    table = step_tables.read_steps(root).table
    assert table.schema == R.ROLLOUT_LOG_SCHEMA
    rows = table.to_pylist()
    assert [r[R.STEP] for r in rows] == [2, 2, 3, 3]
    assert rows[0] == {name: values[0] for name, values in _columns(2).items()}
    assert rows[1][R.RESPONSE_TEXT] is None  # no decoder: the text columns are null
    assert table.schema.field(R.TOKEN_VERSIONS).type == pa.list_(pa.int64())
    assert table.schema.field(R.RESPONSE_IDS).type == pa.list_(pa.int32())
    step_tables.truncate_after(root, 2)  # a resume drops the newer parts, as for metrics
    assert step_tables.part_steps(root) == [2]


def test_a_table_needs_exactly_the_contract_columns() -> None:
    with pytest.raises(KeyError, match=r"not in contract\.rollout_log"):
        R.rollout_table({**_columns(1), "extra": [1, 2]})
    missing = _columns(1)
    del missing[R.LAG]
    with pytest.raises(KeyError):
        R.rollout_table(missing)


def test_logged_steps_are_the_first_every_nth_and_the_last() -> None:
    assert [s for s in range(1, 11) if R.is_logged_step(s, 1, 10)] == list(range(1, 11))
    assert [s for s in range(1, 11) if R.is_logged_step(s, 4, 10)] == [1, 5, 9, 10]
    assert not any(R.is_logged_step(s, 0, 10) for s in range(0, 11))  # 0: off
    assert not R.is_logged_step(0, 1, 10)  # step 0 (the initial eval) trains nothing


def test_logged_groups_depend_on_the_group_id_alone() -> None:
    ids = [f"s0-b{b}-p{p}" for b in range(50) for p in range(8)]
    quarter = [i for i in ids if R.is_logged_group(i, 0.25)]
    assert quarter == [i for i in ids if R.is_logged_group(i, 0.25)]  # the same every call
    assert 0.18 < len(quarter) / len(ids) < 0.32
    assert set(quarter) <= {i for i in ids if R.is_logged_group(i, 0.5)}  # nested shares
    assert all(R.is_logged_group(i, 1.0) for i in ids)
