"""Eval requests through a real redis-server: the learner asks, one generator answers, a dead
generator's request is evaluated again, the weight store keeps what is pending, and an answer
crosses Redis as JSON that decodes to the same report (malformed bytes fail in one line)."""

from __future__ import annotations

import math
import threading
import time

import pytest
import redis

from buffer.eval_requests import EvalRequests, EvalTimeoutError, request_version
from contract.evals import (
    EvalReport,
    EvalReportError,
    EvalSetScore,
    report_from_json,
    report_to_json,
)
from tests.buffer.factories import RUN_ID

REPORT = EvalReport(
    (
        EvalSetScore("addition2", 256, 0.46875, 4, 0.4248046875, {1: 0.4248046875, 4: 0.75}),
        EvalSetScore("heldout", 64, 1 / 3),  # greedy only: NaN sampled scores, no pass@k
    )
)


def _same(a: EvalReport, b: EvalReport) -> bool:
    """Every evals.parquet row equal, float by float (NaN taken as equal to NaN)."""

    def rows(report: EvalReport) -> list[dict[str, object]]:
        nan = "nan"  # dataclass and float equality say NaN != NaN
        return [
            {k: nan if isinstance(v, float) and math.isnan(v) else v for k, v in s.row(0).items()}
            for s in report.scores
        ]

    return rows(a) == rows(b)


def test_a_report_round_trips_through_json_bitwise() -> None:
    back = report_from_json(report_to_json(REPORT))
    assert _same(back, REPORT)
    assert back.scores[0].pass1_sampled == REPORT.scores[0].pass1_sampled  # every bit of a float
    assert math.isnan(back.scores[1].pass1_sampled)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\x80pickle", "not JSON"),
        (b"[]", "non-empty list"),
        (b'[{"eval_set": "Bad Name", "n_prompts": 1, "samples": 0, "pass_at_k": {}}]', "invalid"),
        (b'[{"eval_set": "a", "n_prompts": -1, "samples": 0, "pass_at_k": {}}]', "n_prompts"),
        (
            b'[{"eval_set": "a", "n_prompts": 1, "samples": 0, "pass_at_k": {},'
            b' "greedy_pass_rate": "high"}]',
            "not a number",
        ),
    ],
)
def test_malformed_reports_are_refused_in_one_line(raw: bytes, reason: str) -> None:
    with pytest.raises(EvalReportError, match=reason) as caught:
        report_from_json(raw)
    assert "\n" not in str(caught.value)


def test_one_generator_answers_and_the_learner_reads_it(client: redis.Redis) -> None:
    learner = EvalRequests(client, RUN_ID, wait_timeout_s=5)
    generators = [EvalRequests(client, RUN_ID) for _ in range(2)]
    request_id = learner.request(3)
    assert request_version(request_id) == 3 and learner.pending_versions() == {3}
    assert generators[0].claim("gen-0") == request_id
    assert generators[1].claim("gen-1") is None  # leased: never two generators at once
    generators[0].answer(request_id, REPORT, 1.25)
    report, seconds = learner.wait(request_id)
    assert _same(report, REPORT) and seconds == 1.25
    assert learner.pending_versions() == set()
    assert client.exists(f"gspo:{RUN_ID}:evals:result:{request_id}") == 0  # read once, gone


def test_the_lowest_version_is_claimed_first(client: redis.Redis) -> None:
    requests = EvalRequests(client, RUN_ID)
    ids = {v: requests.request(v) for v in (10, 2, 5)}
    claimed = [requests.claim("g") for _ in range(4)]
    assert claimed == [ids[2], ids[5], ids[10], None]


def test_a_dead_generators_request_is_evaluated_again(client: redis.Redis) -> None:
    learner = EvalRequests(client, RUN_ID, wait_timeout_s=5)
    request_id = learner.request(4)
    dying = EvalRequests(client, RUN_ID, lease_s=0.2)
    assert dying.claim("gen-0") == request_id  # then its process dies mid-eval
    other = EvalRequests(client, RUN_ID)
    assert other.claim("gen-1") is None
    time.sleep(0.3)  # the lease runs out on the Redis clock
    assert other.claim("gen-1") == request_id
    # The supervisor frees a crashed generator's request at once (`release_owned`).
    assert other.release_owned("gen-1") == 1
    assert other.claim("gen-0") == request_id  # its restart, under the same id
    other.answer(request_id, REPORT, 0.5)
    other.answer(request_id, REPORT, 0.7)  # a slow first owner finishing too: never read
    assert learner.wait(request_id)[1] == 0.5


def test_a_resumed_learner_withdraws_the_requests_of_the_one_before(client: redis.Redis) -> None:
    killed = EvalRequests(client, RUN_ID)
    killed.request(5)
    killed.request(10)
    resumed = EvalRequests(client, RUN_ID)
    assert resumed.withdraw_all() == 2
    assert resumed.claim("g") is None and resumed.pending_versions() == set()
    again = resumed.request(5)  # the same version asked again: a new id, never an old answer
    assert again != "" and resumed.claim("g") == again


def test_an_unanswered_request_times_out_in_one_line(client: redis.Redis) -> None:
    learner = EvalRequests(client, RUN_ID, wait_timeout_s=0.3)
    with pytest.raises(EvalTimeoutError, match="no generator answered the eval request of "
                       "policy version 7 within 0 s") as caught:  # fmt: skip
        learner.wait(learner.request(7))
    assert "\n" not in str(caught.value)
    stopping = threading.Event()
    stopping.set()
    patient = EvalRequests(client, RUN_ID, wait_timeout_s=60)
    started = time.monotonic()
    with pytest.raises(EvalTimeoutError):
        patient.wait(patient.request(8), should_stop=stopping.is_set)
    assert time.monotonic() - started < 5


def test_settings_must_be_positive(client: redis.Redis) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        EvalRequests(client, RUN_ID, lease_s=0)
    with pytest.raises(ValueError, match="must be >= 0"):
        EvalRequests(client, RUN_ID).request(-1)
