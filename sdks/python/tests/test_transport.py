"""The retry loop through both transports, with httpx.MockTransport and a virtual clock.

Every test runs twice, through RetryTransport and AsyncRetryTransport (the ``mode`` fixture).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import random
from typing import Any, Iterator, List, Optional

import httpx
import pytest

import oncely
from oncely import Backoff, BudgetConfig, CallOptions, RetryBudget, RetryPolicy

from conftest import FakeClock, Harness, problem, script, status

NO_MINT = RetryPolicy(mint_keys=False)


# -- what is retried ------------------------------------------------------------------------


def test_503_then_success_reuses_one_minted_key(mode: str) -> None:
    h = Harness(mode, script(status(503), status(503), status(201)))
    r = h.request("POST", json={"amount": 1000})
    assert r.status_code == 201
    assert len(h.seen) == 3
    key = h.keys[0]
    assert key is not None and oncely.is_valid_key(key) and len(key) == 36
    assert h.keys == [key, key, key]
    # Byte-identical bodies on every attempt.
    assert {r.content for r in h.seen} == {b'{"amount":1000}'}
    # A new logical call gets a new key.
    h.request("POST", json={"amount": 1000})
    assert h.keys[3] != key


@pytest.mark.parametrize("code", [400, 401, 403, 404, 405, 409, 410, 412, 413, 422])
def test_client_errors_are_sent_once_and_returned(mode: str, code: int) -> None:
    h = Harness(mode, script(status(code)))
    r = h.request("POST", content=b"{}")
    assert r.status_code == code
    assert len(h.seen) == 1


@pytest.mark.parametrize("code", [408, 429, 503])
def test_retried_for_any_method_even_keyless(mode: str, code: int) -> None:
    h = Harness(mode, script(status(code), status(200)), NO_MINT)
    assert h.request("POST", content=b"x").status_code == 200
    assert len(h.seen) == 2
    assert h.keys == [None, None]


@pytest.mark.parametrize("code", [502, 504])
def test_gateway_errors_only_when_safe_to_repeat(mode: str, code: int) -> None:
    keyless = Harness(mode, script(status(code), status(200)), NO_MINT)
    assert keyless.request("POST", content=b"x").status_code == code
    assert len(keyless.seen) == 1
    minted = Harness(mode, script(status(code), status(200)))
    assert minted.request("POST", content=b"x").status_code == 200
    assert len(minted.seen) == 2
    get = Harness(mode, script(status(code), status(200)), NO_MINT)
    assert get.request("GET").status_code == 200


def test_500_is_off_by_default_and_opt_in_for_safe_requests(mode: str) -> None:
    h = Harness(mode, script(status(500), status(200)))
    assert h.request("GET").status_code == 500
    on = Harness(mode, script(status(500), status(200)), RetryPolicy(retry_500=True))
    assert on.request("GET").status_code == 200
    keyless = Harness(mode, script(status(500), status(200)), RetryPolicy(retry_500=True, mint_keys=False))
    assert keyless.request("POST", content=b"x").status_code == 500
    assert len(keyless.seen) == 1


def test_in_flight_conflict_is_retried_with_the_same_key_at_the_throttle_price(mode: str) -> None:
    h = Harness(
        mode,
        script(
            problem(409, "idempotency_request_in_flight", True, retry_after="1"),
            status(201),
        ),
    )
    r = h.request("POST", content=b"{}", extensions={"oncely": CallOptions(idempotency_key="order-confirm-42")})
    assert r.status_code == 201
    assert h.keys == ["order-confirm-42", "order-confirm-42"]
    assert h.clock.sleeps[0] >= 1.0
    # 5 tokens paid, then refunded by the success.
    assert h.transport.budget.available == 500


def test_in_flight_answers_do_not_count_against_max_attempts(mode: str) -> None:
    # docs/DESIGN.md, "In-use answer treated as failure": five in-flight answers under the
    # default limit of 3 attempts, each with Retry-After: 1, then the replay, inside 30 s.
    in_flight = problem(409, "idempotency_request_in_flight", True, retry_after="1")
    h = Harness(mode, script(in_flight, in_flight, in_flight, in_flight, in_flight, status(201)))
    r = h.request("POST", content=b"{}")
    assert r.status_code == 201
    assert len(h.seen) == 6
    assert len(set(h.keys)) == 1 and h.keys[0] is not None
    assert len(h.clock.sleeps) == 5 and min(h.clock.sleeps) >= 1.0


def test_other_failures_still_count_between_in_flight_answers(mode: str) -> None:
    in_flight = problem(409, "idempotency_request_in_flight", True)
    h = Harness(mode, script(status(503), in_flight, in_flight, status(503), status(503), status(201)))
    with pytest.raises(oncely.AttemptsExhausted) as e:
        h.request("POST", content=b"{}")
    assert len(h.seen) == 5
    assert e.value.attempts == 5 and e.value.last_status == 503


def test_other_409s_and_422_are_returned(mode: str) -> None:
    h = Harness(mode, script(problem(409, "idempotency_response_not_retained", False)))
    r = h.request("POST", content=b"{}")
    assert r.status_code == 409 and r.json()["code"] == "idempotency_response_not_retained"
    assert len(h.seen) == 1
    h = Harness(mode, script(problem(422, "idempotency_key_mismatch", False)))
    assert h.request("POST", content=b"{}").status_code == 422
    assert len(h.seen) == 1


def test_problem_retryable_false_is_obeyed_even_on_503(mode: str) -> None:
    h = Harness(mode, script(problem(503, "database_refused", False)))
    r = h.request("POST", content=b"{}")
    assert r.status_code == 503
    assert r.json()["retryable"] is False
    assert len(h.seen) == 1


def test_server_signals_in_both_directions(mode: str) -> None:
    # x-should-retry: false on a 503: returned as is.
    h = Harness(mode, script(status(503, x_should_retry="false"), status(200)))
    assert h.request("GET").status_code == 503
    # Stripe-Should-Retry: false on a 429.
    h = Harness(mode, script(status(429, stripe_should_retry="false"), status(200)))
    assert h.request("GET").status_code == 429
    # x-should-retry: true on a 400 for a keyed POST: retried.
    h = Harness(mode, script(status(400, x_should_retry="true"), status(201)))
    assert h.request("POST", content=b"{}").status_code == 201
    # ... but never for a keyless POST that may have run.
    h = Harness(mode, script(status(500, x_should_retry="true"), status(201)), NO_MINT)
    assert h.request("POST", content=b"{}").status_code == 500
    assert len(h.seen) == 1
    # The order: problem+json retryable beats x-should-retry beats Stripe-Should-Retry.
    h = Harness(mode, script(problem(500, None, True, x_should_retry="false"), status(200)))
    assert h.request("GET").status_code == 200
    h = Harness(mode, script(status(503, x_should_retry="false", stripe_should_retry="true"), status(200)))
    assert h.request("GET").status_code == 503
    h = Harness(mode, script(status(404, stripe_should_retry="true"), status(200)))
    assert h.request("GET").status_code == 200


def test_caller_classifier(mode: str) -> None:
    def busy(r: oncely.ResponseFacts) -> Optional[bool]:
        return True if r.header_values("x-acme-busy") else None

    h = Harness(mode, script(status(418, x_acme_busy="1"), status(200)), classifier=busy)
    assert h.request("GET").status_code == 200
    assert len(h.seen) == 2


# -- Retry-After, backoff and the deadline ----------------------------------------------------


def test_retry_after_is_a_lower_bound_on_the_jittered_backoff(mode: str) -> None:
    h = Harness(mode, script(status(429, retry_after="2"), status(429, retry_after="0"), status(200)), rng_seed=11)
    assert h.request("GET").status_code == 200
    rng = random.Random(11)
    first = Backoff().delay(0, None, rng)
    second = Backoff().delay(1, first, rng)
    # The hint (2 s) is longer than any first backoff (at most 0.5 s): it wins.
    assert h.clock.sleeps[0] == 2.0
    # Retry-After: 0 is not "retry at once": the jittered backoff still applies.
    assert h.clock.sleeps[1] == second
    assert 0 < second <= 1.0


def test_retry_after_http_date_is_honoured(mode: str) -> None:
    clock = FakeClock(wall=784111657.0)  # Sun, 06 Nov 1994 08:47:37 GMT
    h = Harness(
        mode,
        script(status(503, retry_after="Sun, 06 Nov 1994 08:49:37 GMT"), status(200)),
        RetryPolicy(deadline=300.0),
        clock=clock,
    )
    assert h.request("GET").status_code == 200
    assert h.clock.sleeps == [120.0]


def test_malformed_or_negative_retry_after_falls_back_to_backoff(mode: str) -> None:
    for value in ("-5", "soon", "1.5"):
        h = Harness(mode, script(status(503, retry_after=value), status(200)), rng_seed=3)
        assert h.request("GET").status_code == 200
        assert h.clock.sleeps == [Backoff().delay(0, None, random.Random(3))]


def test_retry_after_past_the_deadline_fails_fast_with_the_hint(mode: str) -> None:
    h = Harness(mode, script(status(503, retry_after="120"), status(200)), RetryPolicy(deadline=30.0))
    with pytest.raises(oncely.RetryAfterBeyondDeadline) as info:
        h.request("POST", content=b"{}")
    e = info.value
    assert isinstance(e, oncely.DeadlineExhausted)
    assert e.retry_after == 120.0 and e.hint == 120.0
    assert e.remaining == pytest.approx(30.0)
    assert e.attempts == 1 and e.last_status == 503
    assert e.idempotency_key == h.keys[0]
    assert e.outcome_unknown is False
    assert h.clock.sleeps == []
    assert len(h.seen) == 1


def test_retry_after_just_inside_the_deadline_is_waited(mode: str) -> None:
    h = Harness(mode, script(status(503, retry_after="29"), status(200)), RetryPolicy(deadline=30.0))
    assert h.request("GET").status_code == 200
    assert h.clock.sleeps == [29.0]
    # Exactly the time left does not fit: no sleep may end at or past the deadline.
    h = Harness(mode, script(status(503, retry_after="30"), status(200)), RetryPolicy(deadline=30.0))
    with pytest.raises(oncely.RetryAfterBeyondDeadline):
        h.request("GET")


def test_one_deadline_for_the_call_and_attempt_timeouts_cut_to_it(mode: str) -> None:
    clock = FakeClock()
    timeouts: List[Any] = []

    def slow(request: httpx.Request) -> httpx.Response:
        timeouts.append(dict(request.extensions["timeout"]))
        clock.advance(9.0)  # each attempt takes 9 s
        return httpx.Response(503)

    policy = RetryPolicy(deadline=12.0, max_attempts=5, backoff=Backoff.full_jitter(0.0, 0.0))
    h = Harness(mode, slow, policy, clock=clock)
    start = clock.now
    with pytest.raises(oncely.DeadlineExhausted) as info:
        h.request("GET", timeout=httpx.Timeout(60.0, connect=60.0))
    e = info.value
    assert e.reason == "deadline_exhausted"
    assert e.attempts == 2
    assert e.last_status == 503
    assert clock.now - start <= 12.0 + 9.0  # the second attempt started inside the deadline
    # The first attempt: 10 s (the attempt timeout), 3 s to connect; the second: the 3 s left.
    assert timeouts[0] == {"connect": 3.0, "read": 10.0, "write": 10.0, "pool": 10.0}
    assert timeouts[1] == {"connect": 3.0, "read": 3.0, "write": 3.0, "pool": 3.0}


def test_caller_timeouts_shorter_than_the_attempt_timeout_are_kept(mode: str) -> None:
    seen: List[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.extensions["timeout"]))
        return httpx.Response(200)

    h = Harness(mode, handler)
    h.request("GET", timeout=httpx.Timeout(2.0, connect=1.0))
    assert seen == [{"connect": 1.0, "read": 2.0, "write": 2.0, "pool": 2.0}]
    # No timeout at all from the caller: the policy's.
    h.request("GET", timeout=None)
    assert seen[1] == {"connect": 3.0, "read": 10.0, "write": 10.0, "pool": 10.0}


def test_the_quick_start_client_gets_the_documented_10_s_attempts_not_httpx_5_s(mode: str) -> None:
    # httpx.Client(transport=oncely.RetryTransport()) with no timeout= carries httpx's default
    # 5 s on every request; the attempts must still get min(10 s, time left).
    seen: List[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.extensions["timeout"]))
        return httpx.Response(200)

    h = Harness(mode, handler)
    h.request("GET")
    assert seen == [{"connect": 3.0, "read": 10.0, "write": 10.0, "pool": 10.0}]
    # A shorter attempt timeout is the policy's (or the call's) to set.
    h.request("GET", extensions={"oncely": {"attempt_timeout": 5.0}})
    assert seen[1] == {"connect": 3.0, "read": 5.0, "write": 5.0, "pool": 5.0}


def test_an_attempt_timeout_of_0_is_refused_as_invalid_policy() -> None:
    with pytest.raises(ValueError, match="more than 0"):
        RetryPolicy(attempt_timeout=0)
    with pytest.raises(ValueError, match="more than 0"):
        CallOptions(attempt_timeout=0.0)


def test_no_sleep_ends_past_the_deadline(mode: str) -> None:
    clock = FakeClock()

    def handler(request: httpx.Request) -> httpx.Response:
        clock.advance(0.999)
        return httpx.Response(503)

    policy = RetryPolicy(deadline=1.0, backoff=Backoff.full_jitter(10.0, 10.0))
    h = Harness(mode, handler, policy, clock=clock, rng_seed=5)
    with pytest.raises(oncely.DeadlineExhausted) as info:
        h.request("GET")
    assert info.value.attempts == 1
    assert clock.sleeps == []


def test_attempts_exhausted_carries_status_key_and_count(mode: str) -> None:
    h = Harness(mode, script(problem(503, "server_shutting_down", True)))
    with pytest.raises(oncely.AttemptsExhausted) as info:
        h.request("POST", content=b"{}")
    e = info.value
    assert isinstance(e, oncely.RetryError) and isinstance(e, httpx.RequestError)
    assert e.reason == "attempts_exhausted"
    assert e.attempts == 3
    assert e.last_status == 503
    assert e.problem == oncely.Problem(code="server_shutting_down", retryable=True)
    assert e.idempotency_key == h.keys[0] == h.keys[2]
    assert e.outcome_unknown is False
    assert e.request.method == "POST"
    assert "all 3 attempts failed (after 3 attempts" in str(e)
    assert len(h.clock.sleeps) == 2


def test_per_call_options(mode: str) -> None:
    h = Harness(mode, script(status(503)))
    with pytest.raises(oncely.AttemptsExhausted) as info:
        h.request("GET", extensions={"oncely": {"max_attempts": 5}})
    assert info.value.attempts == 5
    h = Harness(mode, script(status(503)))
    with pytest.raises(oncely.AttemptsExhausted) as info:
        h.request("GET", extensions={"oncely": CallOptions(max_attempts=1)})
    assert info.value.attempts == 1 and len(h.seen) == 1
    h = Harness(mode, script(status(503, retry_after="20"), status(200)))
    with pytest.raises(oncely.RetryAfterBeyondDeadline):
        h.request("GET", extensions={"oncely": CallOptions(deadline=5.0)})
    with pytest.raises(TypeError):
        h.request("GET", extensions={"oncely": {"deadlin": 5.0}})


# -- keys ----------------------------------------------------------------------------------------


def test_caller_key_is_kept_and_not_minted(mode: str) -> None:
    h = Harness(mode, script(status(503), status(201)))
    h.request("POST", content=b"{}", headers={"Idempotency-Key": "order-confirm-7"})
    assert h.keys == ["order-confirm-7", "order-confirm-7"]
    assert h.transport.metrics.snapshot()["keys_minted"] == 0


@pytest.mark.parametrize("bad", ["", "has space", "a" * 256, "caf\u00e9", '"unbalanced', '"bad\\q"'])
def test_invalid_caller_key_is_refused_before_sending(mode: str, bad: str) -> None:
    h = Harness(mode, script(status(201)))
    with pytest.raises(oncely.InvalidIdempotencyKey) as info:
        h.request("POST", content=b"{}", headers={"Idempotency-Key": bad.encode("utf-8")})
    assert info.value.attempts == 0
    assert h.seen == []
    with pytest.raises(oncely.InvalidIdempotencyKey):
        h.request("POST", content=b"{}", extensions={"oncely": CallOptions(idempotency_key=bad)})
    assert h.seen == []


@pytest.mark.parametrize("spaced", ["abc ", " abc", "abc\t", " abc "])
def test_a_key_with_surrounding_whitespace_is_refused_before_sending(mode: str, spaced: str) -> None:
    # The server drops the whitespace and would store "abc", not the key the caller keeps.
    h = Harness(mode, script(status(201)))
    with pytest.raises(oncely.InvalidIdempotencyKey) as info:
        h.request("POST", content=b"{}", headers={"Idempotency-Key": spaced})
    assert info.value.attempts == 0 and info.value.idempotency_key == spaced
    assert "leading or trailing whitespace" in str(info.value)
    with pytest.raises(oncely.InvalidIdempotencyKey) as info:
        h.request("POST", content=b"{}", extensions={"oncely": CallOptions(idempotency_key=spaced)})
    assert info.value.attempts == 0
    assert h.seen == []


def test_repeated_or_conflicting_keys_are_refused(mode: str) -> None:
    h = Harness(mode, script(status(201)))
    with pytest.raises(oncely.InvalidIdempotencyKey, match="sent 2 times"):
        h.request("POST", content=b"{}", headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
    with pytest.raises(oncely.InvalidIdempotencyKey, match="call options another"):
        h.request(
            "POST",
            content=b"{}",
            headers={"Idempotency-Key": "a"},
            extensions={"oncely": CallOptions(idempotency_key="b")},
        )
    assert h.seen == []
    # The quoted form of the IETF draft and a 255-character key are accepted.
    h.request("POST", content=b"{}", headers={"Idempotency-Key": '"abc"'})
    h.request("POST", content=b"{}", headers={"Idempotency-Key": "k" * 255})
    assert h.keys == ['"abc"', "k" * 255]


def test_keys_are_minted_only_for_post_and_patch(mode: str) -> None:
    h = Harness(mode, script(status(200)))
    for method in ("GET", "PUT", "DELETE", "HEAD", "OPTIONS", "POST", "PATCH"):
        h.request(method)
    keys = h.keys
    assert keys[:5] == [None] * 5
    assert keys[5] is not None and keys[6] is not None and keys[5] != keys[6]
    off = Harness(mode, script(status(200)))
    off.request("POST", extensions={"oncely": CallOptions(mint_key=False)})
    assert off.keys == [None]


def test_a_key_maker_that_makes_invalid_keys_is_refused(mode: str) -> None:
    h = Harness(mode, script(status(201)), key_maker=lambda: "not valid")
    with pytest.raises(oncely.InvalidIdempotencyKey) as info:
        h.request("POST", content=b"{}")
    assert info.value.idempotency_key == "not valid"
    assert h.seen == []
    ok = Harness(mode, script(status(503), status(201)), key_maker=lambda: "evt-1")
    ok.request("POST", content=b"{}")
    assert ok.keys == ["evt-1", "evt-1"]


# -- transport failures ------------------------------------------------------------------------


def raising(exc_type: type) -> Any:
    def make(request: httpx.Request) -> Any:
        return exc_type("boom", request=request)

    return make


def test_connect_failures_are_retried_for_any_method(mode: str) -> None:
    for exc in (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
        h = Harness(mode, script(raising(exc), status(201)), NO_MINT)
        assert h.request("POST", content=b"x").status_code == 201
        assert len(h.seen) == 2


@pytest.mark.parametrize("exc", [httpx.ReadTimeout, httpx.WriteTimeout, httpx.ReadError, httpx.RemoteProtocolError])
def test_after_send_failures_of_a_keyless_post_are_outcome_unknown(mode: str, exc: type) -> None:
    h = Harness(mode, script(raising(exc), status(201)), NO_MINT)
    with pytest.raises(oncely.OutcomeUnknown) as info:
        h.request("POST", content=b"x")
    e = info.value
    assert e.outcome_unknown is True
    assert e.attempts == 1 and len(h.seen) == 1
    assert e.idempotency_key is None
    assert isinstance(e.__cause__, exc)
    assert "outcome unknown" in str(e) and "boom" in str(e)


@pytest.mark.parametrize("exc", [httpx.ReadTimeout, httpx.ReadError, httpx.RemoteProtocolError])
def test_after_send_failures_are_retried_with_a_key_or_an_idempotent_method(mode: str, exc: type) -> None:
    keyed = Harness(mode, script(raising(exc), status(201)))
    assert keyed.request("POST", content=b"x").status_code == 201
    assert keyed.keys[0] == keyed.keys[1] is not None
    for method in ("GET", "PUT", "DELETE"):
        h = Harness(mode, script(raising(exc), status(200)), NO_MINT)
        assert h.request(method).status_code == 200
    patch = Harness(mode, script(raising(exc), status(200)), NO_MINT)
    with pytest.raises(oncely.OutcomeUnknown):
        patch.request("PATCH", content=b"x")


def test_bugs_are_not_retried(mode: str) -> None:
    h = Harness(mode, script(raising(httpx.LocalProtocolError), status(200)))
    with pytest.raises(oncely.NotRetryable) as info:
        h.request("GET")
    assert info.value.attempts == 1
    assert isinstance(info.value.__cause__, httpx.LocalProtocolError)
    h = Harness(mode, script(raising(httpx.UnsupportedProtocol), status(200)))
    with pytest.raises(oncely.NotRetryable):
        h.request("GET")

    def broken(request: httpx.Request) -> httpx.Response:
        raise ZeroDivisionError("a bug in a transport")

    h = Harness(mode, broken)
    with pytest.raises(ZeroDivisionError):
        h.request("GET")


def test_another_layers_error_is_classified_by_its_root_cause(mode: str) -> None:
    class Wrapped(Exception):
        pass

    def handler(request: httpx.Request) -> httpx.Response:
        try:
            raise httpx.ConnectError("refused", request=request)
        except httpx.ConnectError as e:
            raise Wrapped("a middleware wrapped it") from e

    h = Harness(mode, script(handler, status(200)))
    assert h.request("GET").status_code == 200


# -- bodies ----------------------------------------------------------------------------------------


def test_streaming_request_body_is_sent_once(mode: str) -> None:
    h = Harness(mode, script(status(503), status(201)))

    def chunks() -> Iterator[bytes]:
        yield b"part-1,"
        yield b"part-2"

    async def achunks() -> Any:
        yield b"part-1,"
        yield b"part-2"

    with pytest.raises(oncely.BodyNotReplayable) as info:
        h.request("POST", content=chunks() if mode == "sync" else achunks())
    e = info.value
    assert e.attempts == 1 and e.last_status == 503
    assert "cannot be resent" in str(e)
    assert [r.content for r in h.seen] == [b"part-1,part-2"]
    # A streaming body whose one attempt succeeds is fine.
    ok = Harness(mode, script(status(201)))
    assert ok.request("POST", content=chunks() if mode == "sync" else achunks()).status_code == 201


def test_retried_response_bodies_are_closed_and_the_last_is_readable(mode: str) -> None:
    closed: List[int] = []

    class Tracked(httpx.SyncByteStream, httpx.AsyncByteStream):
        def __init__(self, n: int, body: bytes) -> None:
            self.n, self.body = n, body

        def __iter__(self) -> Iterator[bytes]:
            yield self.body

        async def __aiter__(self) -> Any:
            yield self.body

        def close(self) -> None:
            closed.append(self.n)

        async def aclose(self) -> None:
            closed.append(self.n)

    n = {"i": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        n["i"] += 1
        code = 503 if n["i"] < 3 else 200
        return httpx.Response(code, stream=Tracked(n["i"], b"body-%d" % n["i"]))

    h = Harness(mode, handler)
    r = h.request("GET")
    assert r.content == b"body-3"
    assert closed[:2] == [1, 2]


def test_problem_body_is_handed_back_intact(mode: str) -> None:
    body = {"type": "about:blank", "status": 400, "code": "invalid_json", "retryable": False, "detail": "x" * 100}
    h = Harness(mode, script(lambda r: httpx.Response(400, json=body, headers={"content-type": "application/problem+json"})))
    r = h.request("POST", content=b"{}")
    assert r.json() == body


def test_gzipped_problem_body_is_decoded_for_classification(mode: str) -> None:
    raw = gzip.compress(json.dumps({"code": "idempotency_request_in_flight", "retryable": True}).encode())

    def in_flight(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            409,
            content=raw,
            headers={"content-type": "application/problem+json", "content-encoding": "gzip"},
        )

    h = Harness(mode, script(in_flight, status(201)))
    assert h.request("POST", content=b"{}").status_code == 201
    assert len(h.seen) == 2


def test_large_json_body_is_not_inspected_and_is_returned_whole(mode: str) -> None:
    big = json.dumps({"code": "idempotency_request_in_flight", "pad": "x" * 70_000}).encode()

    def chunked(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, stream=_Chunks(big), headers={"content-type": "application/json"})

    h = Harness(mode, script(chunked, status(201)))
    r = h.request("POST", content=b"{}")
    # Not read as the in-flight conflict (over 64 KiB): returned, whole.
    assert r.status_code == 409
    assert r.content == big
    assert len(h.seen) == 1


class _Chunks(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that arrives in 4 KiB chunks, optionally breaking after ``fail_after`` bytes."""

    def __init__(self, body: bytes, fail_after: Optional[int] = None) -> None:
        self.body = body
        self.fail_after = fail_after
        self.closed = False

    def _parts(self) -> Iterator[bytes]:
        for i in range(0, len(self.body), 4096):
            if self.fail_after is not None and i >= self.fail_after:
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
            yield self.body[i : i + 4096]

    def __iter__(self) -> Iterator[bytes]:
        yield from self._parts()

    async def __aiter__(self) -> Any:
        for part in self._parts():
            yield part

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


def test_broken_body_on_a_retryable_status_is_that_status(mode: str) -> None:
    body = json.dumps({"code": "x", "pad": "y" * 20_000}).encode()

    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, stream=_Chunks(body, fail_after=8192), headers={"content-type": "application/problem+json"})

    h = Harness(mode, script(broken, status(201)))
    assert h.request("POST", content=b"{}").status_code == 201
    assert len(h.seen) == 2


def test_broken_body_of_a_returned_response_yields_what_arrived_then_the_error(mode: str) -> None:
    body = json.dumps({"code": "x", "pad": "y" * 20_000}).encode()

    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, stream=_Chunks(body, fail_after=8192), headers={"content-type": "application/json"})

    h = Harness(mode, broken)
    transport = h.transport
    if mode == "sync":
        with httpx.Client(transport=transport) as client:
            with client.stream("POST", "http://api.test/x", content=b"{}") as r:
                assert r.status_code == 400
                got = bytearray()
                with pytest.raises(httpx.RemoteProtocolError):
                    for chunk in r.iter_raw():
                        got += chunk
    else:

        async def run() -> bytearray:
            async with httpx.AsyncClient(transport=transport) as client:
                async with client.stream("POST", "http://api.test/x", content=b"{}") as r:
                    assert r.status_code == 400
                    got = bytearray()
                    with pytest.raises(httpx.RemoteProtocolError):
                        async for chunk in r.aiter_raw():
                            got += chunk
                    return got

        got = asyncio.run(run())
    assert bytes(got) == body[:8192]


def test_slow_problem_body_is_bounded_by_the_attempt_and_the_status_decides(mode: str) -> None:
    clock = FakeClock()
    body = json.dumps({"code": "idempotency_request_in_flight", "pad": "z" * 10_000}).encode()

    class Slow(_Chunks):
        def _parts(self) -> Iterator[bytes]:
            for i in range(0, len(self.body), 4096):
                clock.advance(6.0)  # every chunk takes 6 s of the attempt's 10 s
                yield self.body[i : i + 4096]

    def slow(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, stream=Slow(body), headers={"content-type": "application/problem+json"})

    h = Harness(mode, script(slow, status(201)), RetryPolicy(backoff=Backoff.full_jitter(0.0, 0.0)), clock=clock)
    start = clock.now
    assert h.request("POST", content=b"{}").status_code == 201
    assert len(h.seen) == 2
    # Two of the three chunks were read (12 s > the attempt's 10 s), then reading stopped.
    assert clock.now - start == 12.0


# -- the budget ----------------------------------------------------------------------------------


def test_budget_is_shared_drains_refuses_and_refills(mode: str) -> None:
    outage = {"on": True}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503 if outage["on"] else 200)

    policy = RetryPolicy(budget=BudgetConfig(capacity=30), backoff=Backoff.full_jitter(0.0, 0.0))
    h = Harness(mode, handler, policy)
    budget = h.transport.budget
    # Call 1: two retries at 14 tokens each: 30 -> 2.
    with pytest.raises(oncely.AttemptsExhausted):
        h.request("GET")
    assert budget.available == 2
    # Call 2: the bucket cannot pay: no retry, a BudgetExhausted error after one attempt.
    with pytest.raises(oncely.BudgetExhausted) as info:
        h.request("GET")
    assert info.value.attempts == 1 and info.value.last_status == 503
    assert "2 tokens left, a retry costs 14" in str(info.value)
    assert budget.available == 2
    # The outage ends: first-attempt successes refund 1 each, and retries come back.
    outage["on"] = False
    for _ in range(12):
        h.request("GET")
    assert budget.available == 14
    outage["on"] = True
    seen = len(h.seen)
    with pytest.raises(oncely.BudgetExhausted):
        h.request("GET")
    assert len(h.seen) - seen == 2  # one retry paid for, then the bucket was empty again


def test_a_success_after_a_retry_refunds_that_retry(mode: str) -> None:
    h = Harness(mode, script(status(503), status(429), status(200)))
    h.request("GET")
    # 14 (transient) + 5 (throttle) spent, the last retry's 5 refunded.
    assert h.transport.budget.available == 500 - 14
    shared = RetryBudget(BudgetConfig(capacity=100))
    a = Harness(mode, script(status(503), status(200)), budget=shared)
    b = Harness(mode, script(status(503), status(503), status(503)), budget=shared)
    a.request("GET")
    assert shared.available == 100
    with pytest.raises(oncely.AttemptsExhausted):
        b.request("GET")
    assert shared.available == 72
    assert a.transport.budget is b.transport.budget is shared
    none = Harness(mode, script(status(503)), budget=None)
    with pytest.raises(oncely.AttemptsExhausted):
        none.request("GET")
    assert none.transport.budget is None


# -- stacking ----------------------------------------------------------------------------------


def test_two_layers_of_ours_never_multiply_attempts(mode: str) -> None:
    clock = FakeClock()
    seen: List[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(503)

    mock = httpx.MockTransport(handler)
    if mode == "sync":
        inner: Any = oncely.RetryTransport(mock, RetryPolicy(max_attempts=5), clock=clock)
        outer: Any = oncely.RetryTransport(inner, clock=clock)
    else:
        inner = oncely.AsyncRetryTransport(mock, RetryPolicy(max_attempts=5), clock=clock)
        outer = oncely.AsyncRetryTransport(inner, clock=clock)
    h = Harness(mode, handler)
    h.transport = outer
    with pytest.raises(oncely.AttemptsExhausted) as info:
        h.request("POST", content=b"{}")
    assert info.value.attempts == 3
    assert len(seen) == 3
    keys = {r.headers["idempotency-key"] for r in seen}
    assert len(keys) == 1
    # The inner layer minted nothing, retried nothing, and was charged nothing.
    assert inner.metrics.snapshot()["calls"] == 0
    assert inner.budget.available == 500
    assert "oncely.active" not in seen[0].extensions


def test_a_foreign_retry_layer_between_two_of_ours_is_stopped(mode: str) -> None:
    clock = FakeClock()
    seen: List[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(503)

    mock = httpx.MockTransport(handler)

    class NaiveRetry(httpx.BaseTransport, httpx.AsyncBaseTransport):
        """A retry layer that resends every 503 up to 4 times (what oncely replaces)."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            r = httpx.Response(599)
            for _ in range(4):
                r = self.inner.handle_request(request)
                assert isinstance(r, httpx.Response)
                if r.status_code != 503:
                    return r
            return r

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            r = httpx.Response(599)
            for _ in range(4):
                r = await self.inner.handle_async_request(request)
                assert isinstance(r, httpx.Response)
                if r.status_code != 503:
                    return r
            return r

    if mode == "sync":
        outer: Any = oncely.RetryTransport(NaiveRetry(oncely.RetryTransport(mock, clock=clock)), clock=clock)
    else:
        outer = oncely.AsyncRetryTransport(NaiveRetry(oncely.AsyncRetryTransport(mock, clock=clock)), clock=clock)
    h = Harness(mode, handler)
    h.transport = outer
    with pytest.raises(oncely.NestedRetryLayer) as info:
        h.request("POST", content=b"{}")
    # The inner guard let the call's 3 sends through and refused the fourth.
    assert len(seen) == 3
    assert info.value.attempts == 3
    assert info.value.last_status == 503


# -- logging, metrics, cancellation --------------------------------------------------------------


def test_every_retry_is_logged_with_attempt_cause_wait_and_key(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="oncely")
    h = Harness(mode, script(status(503, retry_after="1"), status(201)))
    h.request("POST", content=b"{}")
    retries = [r for r in caplog.records if r.getMessage().startswith("oncely: retrying")]
    assert len(retries) == 1
    rec: Any = retries[0]
    assert rec.levelno == logging.INFO
    assert rec.oncely_attempt == 1 and rec.oncely_next_attempt == 2
    assert rec.oncely_reason == "503" and rec.oncely_status == 503
    assert rec.oncely_wait == 1.0 and rec.oncely_wait_source == "retry-after"
    assert rec.oncely_idempotency_key == h.keys[0]
    assert rec.oncely_tokens_left == 486
    assert h.keys[0] in rec.getMessage()
    snap = h.transport.metrics.snapshot()
    assert (snap["calls"], snap["attempts"], snap["retries"], snap["retry_after_waits"], snap["keys_minted"]) == (1, 2, 1, 1, 1)


def test_giving_up_is_logged_as_a_warning(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="oncely")
    h = Harness(mode, script(raising(httpx.ReadTimeout)), NO_MINT)
    with pytest.raises(oncely.OutcomeUnknown):
        h.request("POST", content=b"{}")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert getattr(warnings[0], "oncely_reason") == "outcome_unknown"
    assert h.transport.metrics.snapshot()["by_reason"] == {"outcome_unknown": 1}


def test_keyboard_interrupt_during_the_sleep_stops_at_once_and_refunds() -> None:
    class Interrupting(FakeClock):
        def sleep(self, seconds: float) -> None:
            self.sleeps.append(seconds)
            raise KeyboardInterrupt

    h = Harness("sync", script(status(503), status(200)), clock=Interrupting())
    with pytest.raises(KeyboardInterrupt):
        h.request("GET")
    assert len(h.seen) == 1
    assert h.transport.budget.available == 500
    assert "oncely.active" not in h.seen[0].extensions


def test_keyboard_interrupt_during_an_attempt_refunds_nothing_it_did_not_spend() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise KeyboardInterrupt

    h = Harness("sync", script(status(503), handler))
    with pytest.raises(KeyboardInterrupt):
        h.request("GET")
    # The first retry was paid for and made: its 14 tokens stay spent; no success refund.
    assert h.transport.budget.available == 486
    assert len(h.seen) == 2


def test_async_cancellation_during_the_sleep_stops_at_once_and_refunds() -> None:
    """With the real clock: a 1 s Retry-After sleep, cancelled after 50 ms."""
    seen: List[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(503, headers={"retry-after": "1"})

    transport = oncely.AsyncRetryTransport(httpx.MockTransport(handler))

    async def run() -> float:
        loop = asyncio.get_running_loop()
        async with httpx.AsyncClient(transport=transport) as client:
            task = asyncio.ensure_future(client.get("http://api.test/x"))
            await asyncio.sleep(0.05)
            assert transport.budget is not None and transport.budget.available == 486
            began = loop.time()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return loop.time() - began

    took = asyncio.run(run())
    assert took < 0.5  # the cancellation did not wait out the 1 s sleep
    assert len(seen) == 1
    assert transport.budget is not None and transport.budget.available == 500


def test_async_cancellation_during_an_attempt_propagates() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return httpx.Response(200)

    transport = oncely.AsyncRetryTransport(httpx.MockTransport(hang))

    async def run() -> None:
        async with httpx.AsyncClient(transport=transport) as client:
            task = asyncio.ensure_future(client.get("http://api.test/x"))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(asyncio.wait_for(run(), 5))
    assert transport.budget is not None and transport.budget.available == 500
    assert transport.metrics.snapshot()["gave_up"] == 0


def test_async_attempt_is_bounded_as_a_whole() -> None:
    """The async transport's own bound: an attempt that does not answer within its limit is a
    timeout after sending (retried for a GET), whatever the inner transport does."""
    calls = {"n": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            await asyncio.sleep(30)
        return httpx.Response(200)

    transport = oncely.AsyncRetryTransport(httpx.MockTransport(handler), RetryPolicy(attempt_timeout=0.1))

    async def run() -> int:
        async with httpx.AsyncClient(transport=transport) as client:
            r = await client.get("http://api.test/x")
            return r.status_code

    assert asyncio.run(asyncio.wait_for(run(), 10)) == 200
    assert calls["n"] == 2

    post = oncely.AsyncRetryTransport(
        httpx.MockTransport(handler), RetryPolicy(attempt_timeout=0.1, mint_keys=False)
    )
    calls["n"] = 0

    async def run_post() -> None:
        async with httpx.AsyncClient(transport=post) as client:
            await client.post("http://api.test/x", content=b"x")

    with pytest.raises(oncely.OutcomeUnknown) as info:
        asyncio.run(asyncio.wait_for(run_post(), 10))
    assert isinstance(info.value.__cause__, httpx.TimeoutException)


def test_resending_the_same_request_object_resends_its_key(mode: str) -> None:
    """A minted key is set on the request itself: a caller who sends the same httpx.Request
    again (its own retry, later) sends the same key, and the server collapses the two."""
    h = Harness(mode, script(status(201)))
    request = httpx.Request("POST", "http://api.test/v1/payments", content=b"{}")
    if mode == "sync":
        with httpx.Client(transport=h.transport) as client:
            client.send(request)
            client.send(request)
    else:

        async def run() -> None:
            async with httpx.AsyncClient(transport=h.transport) as client:
                await client.send(request)
                await client.send(request)

        asyncio.run(run())
    assert h.keys[0] is not None and h.keys == [h.keys[0]] * 2
    assert h.transport.metrics.snapshot()["keys_minted"] == 1
    assert "oncely.active" not in request.extensions
