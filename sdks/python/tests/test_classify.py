"""The allowlist and the server's explicit word, ported from the Rust SDK's classify tests."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from oncely.classify import (
    AFTER_SEND,
    BEFORE_SEND,
    CONNECT,
    DONE,
    NOT_RETRYABLE,
    OTHER,
    OUTCOME_UNKNOWN,
    RESET,
    TIMEOUT,
    Problem,
    ResponseFacts,
    Retry,
    RetryReason,
    bool_header,
    classify_response,
    classify_transport,
)

POST = ("POST", False)
KEYED_POST = ("POST", True)
GET = ("GET", False)


def facts(status: int, problem: Optional[Problem] = None, headers: Sequence[Tuple[str, str]] = ()) -> ResponseFacts:
    h: Dict[str, List[str]] = {}
    for k, v in headers:
        h.setdefault(k.lower(), []).append(v)
    return ResponseFacts(status, h, problem)


def verdict(req: Tuple[str, bool], status: int, retry_500: bool = False, problem: Optional[Problem] = None, headers: Sequence[Tuple[str, str]] = ()) -> object:
    return classify_response(req[0], req[1], facts(status, problem, headers), retry_500)


def test_client_errors_are_never_retried() -> None:
    for status in (400, 401, 403, 404, 405, 409, 410, 412, 413, 422):
        for req in (POST, KEYED_POST, GET):
            assert verdict(req, status, retry_500=True) == DONE, (status, req)


def test_throttles_request_timeouts_and_unavailable_for_every_method() -> None:
    for req in (POST, KEYED_POST, GET):
        assert verdict(req, 429) == Retry(RetryReason("throttled", 429))
        assert verdict(req, 408) == Retry(RetryReason("request_timeout", 408))
        assert verdict(req, 503) == Retry(RetryReason("server_error", 503))


def test_gateway_errors_need_a_safe_request() -> None:
    assert verdict(POST, 502) == DONE
    assert verdict(POST, 504) == DONE
    assert verdict(KEYED_POST, 504) == Retry(RetryReason("server_error", 504))
    assert verdict(GET, 502) == Retry(RetryReason("server_error", 502))
    assert verdict(("DELETE", False), 502) == Retry(RetryReason("server_error", 502))
    assert verdict(("PATCH", False), 502) == DONE


def test_five_hundred_is_off_by_default() -> None:
    assert verdict(GET, 500) == DONE
    assert verdict(GET, 500, retry_500=True) == Retry(RetryReason("server_error", 500))
    assert verdict(POST, 500, retry_500=True) == DONE


def test_problem_json_codes() -> None:
    in_flight = Problem(code="idempotency_request_in_flight", retryable=True)
    assert verdict(KEYED_POST, 409, problem=in_flight) == Retry(RetryReason("in_flight", 409))
    mismatch = Problem(code="idempotency_key_mismatch", retryable=False)
    assert verdict(KEYED_POST, 422, problem=mismatch) == DONE
    assert verdict(KEYED_POST, 409, problem=mismatch) == DONE
    no = Problem(retryable=False)
    assert verdict(GET, 503, problem=no) == DONE
    assert verdict(GET, 429, problem=no) == DONE


def test_transport_phases() -> None:
    assert classify_transport(False, BEFORE_SEND, CONNECT) == Retry(RetryReason("connect_failed"))
    assert classify_transport(False, AFTER_SEND, TIMEOUT) == OUTCOME_UNKNOWN
    assert classify_transport(False, AFTER_SEND, RESET) == OUTCOME_UNKNOWN
    assert classify_transport(True, AFTER_SEND, TIMEOUT) == Retry(RetryReason("timed_out"))
    assert classify_transport(True, AFTER_SEND, RESET) == Retry(RetryReason("connection_reset"))
    assert classify_transport(True, BEFORE_SEND, OTHER) == NOT_RETRYABLE
    assert classify_transport(False, AFTER_SEND, CONNECT) == Retry(RetryReason("connect_failed"))


def test_bool_headers_accept_only_one_true_or_false() -> None:
    assert bool_header([" True "]) is True
    assert bool_header(["false"]) is False
    assert bool_header(["1"]) is None
    assert bool_header(["yes"]) is None
    assert bool_header(["true", "false"]) is None
    assert bool_header([]) is None


def test_explicit_word_precedence_and_limits() -> None:
    assert verdict(GET, 503, headers=[("Stripe-Should-Retry", "false")]) == DONE
    both = [("x-should-retry", "true"), ("stripe-should-retry", "false")]
    assert verdict(GET, 503, headers=both) == Retry(RetryReason("server_error", 503))
    # x-should-retry (2) beats Stripe-Should-Retry (3) and the allowlist.
    assert verdict(GET, 503, headers=[("x-should-retry", "false"), ("stripe-should-retry", "true")]) == DONE
    yes = [("x-should-retry", "true")]
    assert verdict(KEYED_POST, 400, headers=yes) == Retry(RetryReason("server_asked", 400, "x-should-retry"))
    # `true` never makes an unsafe request retryable.
    assert verdict(POST, 400, headers=yes) == DONE
    assert verdict(POST, 500, headers=yes) == DONE
    # Success and redirects are never turned into retries.
    assert verdict(GET, 200, headers=yes) == DONE
    assert verdict(GET, 304, headers=yes) == DONE
    # The problem's `retryable` comes first.
    assert verdict(GET, 503, problem=Problem(retryable=False), headers=yes) == DONE
    assert verdict(GET, 500, problem=Problem(retryable=True), headers=[("x-should-retry", "false")]) == Retry(
        RetryReason("server_asked", 500, "problem+json retryable")
    )
    # Stripe's header alone decides both ways.
    assert verdict(GET, 404, headers=[("stripe-should-retry", "true")]) == Retry(
        RetryReason("server_asked", 404, "Stripe-Should-Retry")
    )


def test_caller_classifier_comes_after_the_server_before_the_allowlist() -> None:
    def teapot(r: ResponseFacts) -> Optional[bool]:
        return True if r.status == 418 else None

    assert classify_response("GET", False, facts(418), False, teapot) == Retry(
        RetryReason("server_asked", 418, "the caller's classifier")
    )

    def refuse(r: ResponseFacts) -> Optional[bool]:
        return False

    assert classify_response("GET", False, facts(503, headers=[("x-should-retry", "true")]), False, refuse) == Retry(
        RetryReason("server_error", 503)
    )
    assert classify_response("GET", False, facts(503), False, refuse) == DONE


def test_costs() -> None:
    assert RetryReason("throttled", 429).cost == "throttle"
    assert RetryReason("in_flight", 409).cost == "throttle"
    assert RetryReason("server_asked", 429, "x-should-retry").cost == "throttle"
    assert RetryReason("server_error", 503).cost == "transient"
    assert RetryReason("timed_out").cost == "transient"
    assert RetryReason("connect_failed").cost == "transient"


def test_problem_parsing() -> None:
    p = Problem.from_json(
        b'{"type":"about:blank","status":409,"code":"idempotency_request_in_flight","retryable":true}'
    )
    assert p == Problem(code="idempotency_request_in_flight", retryable=True)
    assert Problem.from_json(b"not json") is None
    assert Problem.from_json(b"[1, 2]") is None
    assert Problem.from_json(b"{}") == Problem()
    # As the Rust SDK's serde reads it: a field of the wrong type spoils the whole problem.
    assert Problem.from_json(b'{"code": 5, "retryable": false}') is None
    assert Problem.from_json(b'{"retryable": "false"}') is None
