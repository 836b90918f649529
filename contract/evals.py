"""The per-eval-set scores a trial records: names of `evals.parquet` columns and MLflow keys.

A trial evaluates every `learner.eval_every` steps on each eval set of the experiment (`evals` in
the config; by default one set named DEFAULT_EVAL_SET built from `task`). The learner writes one
row per (step, eval set) to `<trial>/evals.parquet/` (learner.runtime.evals_log); the harness logs
the same values to the trial's MLflow run under `eval/<set>/<score>`; the analysis reads either. The
first set's greedy pass rate is also `eval/pass_rate` of metrics.parquet, so a single-set experiment
reads exactly as before this table existed.

Columns: STEP int64, EVAL_SET string, N_PROMPTS int64, GREEDY_PASS_RATE float64, SAMPLES int64
(k drawn per prompt at the sampling temperature, 0 = greedy only), PASS1_SAMPLED float64 (mean
over prompts of c / n), and `pass_at_<k>` float64 per configured k (contract.pass_at_k; NaN when
SAMPLES is 0). A response counts as correct when its reward is >= 1, as in `eval/pass_rate`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

STEP: Final = "step"
EVAL_SET: Final = "eval_set"
N_PROMPTS: Final = "n_prompts"
GREEDY_PASS_RATE: Final = "greedy_pass_rate"
SAMPLES: Final = "samples"
PASS1_SAMPLED: Final = "pass1_sampled"
PASS_AT_PREFIX: Final = "pass_at_"

# The eval set of a config that names none: `task`'s held-out split.
DEFAULT_EVAL_SET: Final = "heldout"
# Eval-set names become column values and parts of MLflow keys: keep them plain.
EVAL_SET_NAME_PATTERN: Final = r"^[a-z0-9_]+$"

_PASS_AT = re.compile(rf"^{PASS_AT_PREFIX}(\d+)$")


def pass_at_column(k: int) -> str:
    """`pass_at_<k>`: the evals.parquet column of pass@k."""
    return f"{PASS_AT_PREFIX}{k}"


def k_of_column(name: str) -> int | None:
    """k of a `pass_at_<k>` column, None for any other column."""
    match = _PASS_AT.match(name)
    return int(match.group(1)) if match else None


def mlflow_key(eval_set: str, score: str) -> str:
    """`eval/<set>/<score>` with score `greedy_pass_rate`, `pass1` or `pass_at_<k>`."""
    return f"eval/{eval_set}/{score}"


@dataclass(frozen=True)
class EvalSetScore:
    """One eval set's scores at one step (one row of evals.parquet)."""

    eval_set: str
    n_prompts: int
    greedy_pass_rate: float
    samples: int = 0
    pass1_sampled: float = math.nan
    pass_at_k: Mapping[int, float] = field(default_factory=dict)  # k -> mean pass@k

    def row(self, step: int) -> dict[str, object]:
        """The evals.parquet row of this score at `step`."""
        row: dict[str, object] = {
            STEP: step,
            EVAL_SET: self.eval_set,
            N_PROMPTS: self.n_prompts,
            GREEDY_PASS_RATE: self.greedy_pass_rate,
            SAMPLES: self.samples,
            PASS1_SAMPLED: self.pass1_sampled,
        }
        for k in sorted(self.pass_at_k):
            row[pass_at_column(k)] = self.pass_at_k[k]
        return row

    def mlflow_metrics(self) -> dict[str, float]:
        """The MLflow keys and values of this score; unmeasured (NaN) values are left out."""
        values = {
            mlflow_key(self.eval_set, GREEDY_PASS_RATE): self.greedy_pass_rate,
            mlflow_key(self.eval_set, "pass1"): self.pass1_sampled,
        }
        for k in sorted(self.pass_at_k):
            values[mlflow_key(self.eval_set, pass_at_column(k))] = self.pass_at_k[k]
        return {key: value for key, value in values.items() if not math.isnan(value)}


@dataclass(frozen=True)
class EvalReport:
    """Every eval set's scores at one step; the first set is the primary one."""

    scores: tuple[EvalSetScore, ...]

    def __post_init__(self) -> None:
        if not self.scores:
            raise ValueError("an eval report needs at least one eval set")

    @property
    def pass_rate(self) -> float:
        """The primary set's greedy pass rate: metrics.parquet's `eval/pass_rate`."""
        return self.scores[0].greedy_pass_rate


def report_to_json(report: EvalReport) -> bytes:
    """The report as JSON bytes: what a generator sends the learner through Redis (never a
    pickle). NaN (unmeasured sampled scores) is written as null; pass@k keys as strings."""

    def number(value: float) -> float | None:
        return None if math.isnan(value) else value

    return json.dumps(
        [
            {
                EVAL_SET: s.eval_set,
                N_PROMPTS: s.n_prompts,
                GREEDY_PASS_RATE: s.greedy_pass_rate,
                SAMPLES: s.samples,
                PASS1_SAMPLED: number(s.pass1_sampled),
                "pass_at_k": {str(k): number(v) for k, v in sorted(s.pass_at_k.items())},
            }
            for s in report.scores
        ],
        allow_nan=False,
    ).encode()


class EvalReportError(ValueError):
    """Bytes that are not an eval report: the one-line reason."""


def report_from_json(raw: bytes) -> EvalReport:
    """`report_to_json`'s inverse; EvalReportError names what is wrong with anything else."""

    def number(value: object, what: str) -> float:
        if value is None:
            return math.nan
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise EvalReportError(f"eval report: {what} is {value!r}, not a number")
        return float(value)

    try:
        rows = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EvalReportError(f"eval report: not JSON ({exc})") from None
    if not isinstance(rows, list) or not rows:
        raise EvalReportError("eval report: expected a non-empty list of eval-set scores")
    scores = []
    for row in rows:
        if not isinstance(row, dict):
            raise EvalReportError(f"eval report: a score is {type(row).__name__}, not an object")
        name, n, samples = row.get(EVAL_SET), row.get(N_PROMPTS), row.get(SAMPLES)
        if not isinstance(name, str) or not re.match(EVAL_SET_NAME_PATTERN, name):
            raise EvalReportError(f"eval report: eval set name {name!r} is invalid")
        for field_name, value in ((N_PROMPTS, n), (SAMPLES, samples)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise EvalReportError(f"eval report: {name}.{field_name} is {value!r}")
        at_k = row.get("pass_at_k")
        if not isinstance(at_k, dict) or not all(str(k).isdigit() for k in at_k):
            raise EvalReportError(f"eval report: {name}.pass_at_k is {at_k!r}")
        scores.append(
            EvalSetScore(
                name,
                n,
                number(row.get(GREEDY_PASS_RATE), f"{name}.{GREEDY_PASS_RATE}"),
                samples,
                number(row.get(PASS1_SAMPLED), f"{name}.{PASS1_SAMPLED}"),
                {int(k): number(v, f"{name}.pass_at_{k}") for k, v in at_k.items()},
            )
        )
    return EvalReport(tuple(scores))
