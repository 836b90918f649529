"""The rollouts a trial trained, as it trained them: the columns of `rollouts.parquet/`.

Why: metrics say how much reward went up; only the samples say what the policy learned to write
(a verifier exploited, a format collapsed, an arm that learned to stop early). The learner writes
one row per trained sample to `<trial>/rollouts.parquet/`, one part per logged step through
`contract.step_tables`, on its records writer thread (`learner.runtime.records`), so the parts
are truncated on resume and vouched for by checkpoints like the metric and eval parts. Which
steps and groups are logged is `learner.rollout_log` (`every` N steps, a `share` of the groups
chosen by `is_logged_group`); the harness reads the table back (`harness.experiment.trial_runs.
read_rollouts`) and the report shows a few completions per arm.

Columns, one row per sample of a trained group:
- STEP int64: the metrics.parquet step whose update trained the group (step k trains batch
  k - 1 with the learner at version k - 1);
- GROUP_ID string, PROMPT_INDEX int64, SAMPLE_INDEX int64: the group, its prompt draw and the
  sample's place in the group;
- POLICY_VERSION int64: the group's version (the version that started generating it);
- LAG int64: (STEP - 1) - POLICY_VERSION, the lag of the ledger and of `staleness/*`;
- PROMPT_IDS, RESPONSE_IDS list<int32>: the tokens as trained;
- PROMPT_TEXT, RESPONSE_TEXT string: decoded by the harness's tokenizer (the prompt with its
  special tokens, the response as the verifier read it: cut at EOS, special tokens skipped);
  null when the learner ran without a decoder (a learner test);
- REWARD float64, FINISH_REASON string (`stop` | `length`);
- BEHAVIOR_LOGPROBS list<float32>: the generator's logprob of each response token;
- TOKEN_VERSIONS list<int64>: the policy version that sampled each response token, one per
  response token. Rollout records that carry no per-token versions (schema v1 and v2) were
  generated whole by one version, so every token has the group's POLICY_VERSION; once the
  record carries per-token versions (partial rollouts), this column holds the record's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Final

import pyarrow as pa

STEP: Final = "step"
GROUP_ID: Final = "group_id"
PROMPT_INDEX: Final = "prompt_index"
SAMPLE_INDEX: Final = "sample_index"
POLICY_VERSION: Final = "policy_version"
LAG: Final = "lag"
PROMPT_IDS: Final = "prompt_ids"
RESPONSE_IDS: Final = "response_ids"
PROMPT_TEXT: Final = "prompt_text"
RESPONSE_TEXT: Final = "response_text"
REWARD: Final = "reward"
FINISH_REASON: Final = "finish_reason"
BEHAVIOR_LOGPROBS: Final = "behavior_logprobs"
TOKEN_VERSIONS: Final = "token_versions"

ROLLOUT_LOG_SCHEMA: Final = pa.schema(
    [
        pa.field(STEP, pa.int64()),
        pa.field(GROUP_ID, pa.string()),
        pa.field(PROMPT_INDEX, pa.int64()),
        pa.field(SAMPLE_INDEX, pa.int64()),
        pa.field(POLICY_VERSION, pa.int64()),
        pa.field(LAG, pa.int64()),
        pa.field(PROMPT_IDS, pa.list_(pa.int32())),
        pa.field(RESPONSE_IDS, pa.list_(pa.int32())),
        pa.field(PROMPT_TEXT, pa.string()),
        pa.field(RESPONSE_TEXT, pa.string()),
        pa.field(REWARD, pa.float64()),
        pa.field(FINISH_REASON, pa.string()),
        pa.field(BEHAVIOR_LOGPROBS, pa.list_(pa.float32())),
        pa.field(TOKEN_VERSIONS, pa.list_(pa.int64())),
    ]
)


def rollout_table(columns: Mapping[str, Sequence[object]]) -> pa.Table:
    """One part's rows from {column: values} (every column of ROLLOUT_LOG_SCHEMA, equal
    lengths), typed by the schema; a missing or unknown column raises KeyError."""
    unknown = sorted(set(columns) - set(ROLLOUT_LOG_SCHEMA.names))
    if unknown:
        raise KeyError(f"rollout log columns {unknown} are not in contract.rollout_log")
    return pa.table(
        {name: columns[name] for name in ROLLOUT_LOG_SCHEMA.names}, schema=ROLLOUT_LOG_SCHEMA
    )


def is_logged_step(step: int, every: int, last_step: int) -> bool:
    """Whether step `step` (1-based, as in metrics.parquet) is logged under `every`: the first
    step, every `every`-th after it, and the last (a report compares the first and the last);
    none when `every` is 0."""
    if every <= 0 or step < 1:
        return False
    return (step - 1) % every == 0 or step == last_step


def is_logged_group(group_id: str, share: float) -> bool:
    """Whether a group of a logged step is logged under `share`: decided by a hash of its id
    alone, so a rerun, a resume and every arm of a seed (same group ids) log the same groups;
    roughly `share` of the groups are."""
    if share >= 1.0:
        return True
    digest = hashlib.sha256(group_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share
