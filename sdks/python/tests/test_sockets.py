"""Faults at the socket level, through httpx's real transports (sync and async): refused
connections, resets after the request was read, hangs, cut-off and slow bodies, and no leaked
connections."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable, Optional, Tuple, Union

import httpx
import pytest

import oncely
from oncely import Backoff, RetryPolicy

from faultserver import FaultServer, Step, refused_url

FAST = Backoff.full_jitter(0.01, 0.02)


def call(
    mode: str,
    method: str,
    url: str,
    policy: Optional[RetryPolicy] = None,
    read: bool = True,
    **kwargs: Any,
) -> Tuple[Union[httpx.Response, oncely.RetryError], Any, float]:
    """One logical call through a fresh client; the response (body read) or the RetryError, the
    retry transport, and the seconds it took."""
    policy = policy or RetryPolicy(backoff=FAST)
    if mode == "sync":
        transport: Any = oncely.RetryTransport(httpx.HTTPTransport(), policy)
        began = time.monotonic()
        with httpx.Client(transport=transport, timeout=None) as client:
            try:
                r = client.request(method, url, **kwargs)
                return r, transport, time.monotonic() - began
            except oncely.RetryError as e:
                return e, transport, time.monotonic() - began

    async def run() -> Tuple[Union[httpx.Response, oncely.RetryError], Any, float]:
        transport = oncely.AsyncRetryTransport(httpx.AsyncHTTPTransport(), policy)
        began = time.monotonic()
        async with httpx.AsyncClient(transport=transport, timeout=None) as client:
            try:
                r = await client.request(method, url, **kwargs)
                return r, transport, time.monotonic() - began
            except oncely.RetryError as e:
                return e, transport, time.monotonic() - began

    return asyncio.run(run())


OK = Step(201, {"content-type": "application/json"}, b'{"id":"pay_1"}')
NO_MINT = RetryPolicy(backoff=FAST, mint_keys=False)


def test_refused_connection_sends_nothing_and_is_retried_for_a_keyless_post(mode: str) -> None:
    result, transport, _ = call(mode, "POST", refused_url() + "/v1/payments", NO_MINT, content=b"{}")
    assert isinstance(result, oncely.AttemptsExhausted)
    assert result.attempts == 3
    assert result.last_status is None and result.outcome_unknown is False
    assert isinstance(result.__cause__, httpx.ConnectError)
    assert transport.metrics.snapshot()["retries"] == 2


def test_reset_after_the_request_was_read(mode: str) -> None:
    with FaultServer(Step(fault="reset"), OK) as server:
        result, _, _ = call(mode, "POST", server.url + "/v1/payments", NO_MINT, content=b'{"a":1}')
        assert isinstance(result, oncely.OutcomeUnknown)
        assert result.outcome_unknown is True and result.attempts == 1
        assert len(server.seen) == 1
    with FaultServer(Step(fault="reset"), OK) as server:
        result, _, _ = call(mode, "POST", server.url + "/v1/payments", content=b'{"a":1}')
        assert isinstance(result, httpx.Response) and result.status_code == 201
        assert [s.body for s in server.seen] == [b'{"a":1}', b'{"a":1}']
        keys = [s.headers["idempotency-key"] for s in server.seen]
        assert keys[0] == keys[1] and oncely.is_valid_key(keys[0])


def test_a_hang_ends_at_the_attempt_timeout(mode: str) -> None:
    policy = RetryPolicy(backoff=FAST, attempt_timeout=0.2)
    with FaultServer(Step(fault="hang"), OK) as server:
        result, _, took = call(mode, "GET", server.url + "/v1/payments/pay_1", policy)
        assert isinstance(result, httpx.Response) and result.status_code == 201
        assert len(server.seen) == 2
        # The rule is a bound: the hung attempt ended at its 0.2 s timeout (slack for a busy
        # machine), not at the server's 30 s.
        assert took < 5.0
    with FaultServer(Step(fault="hang"), OK) as server:
        result, _, _ = call(mode, "POST", server.url + "/v1/payments", policy.replace(mint_keys=False), content=b"{}")
        assert isinstance(result, oncely.OutcomeUnknown)
        assert isinstance(result.__cause__, httpx.TimeoutException)


def test_the_deadline_cuts_a_hung_attempt(mode: str) -> None:
    policy = RetryPolicy(backoff=FAST, deadline=0.3, attempt_timeout=1.0)
    with FaultServer(Step(fault="hang")) as server:
        result, _, took = call(mode, "POST", server.url + "/v1/payments", policy, content=b"{}")
        assert isinstance(result, oncely.DeadlineExhausted)
        assert result.attempts == 1 and result.last_status is None
        assert result.idempotency_key is not None
        assert 0.29 <= took < 3.0


def test_cut_off_body_on_a_503_is_still_a_503(mode: str) -> None:
    body = json.dumps({"code": "idempotency_store_unavailable", "retryable": True, "pad": "x" * 500}).encode()
    cut = Step(503, {"content-type": "application/problem+json"}, body, fault="cut", cut_after=40)
    with FaultServer(cut, OK) as server:
        result, _, _ = call(mode, "POST", server.url + "/v1/payments", content=b"{}")
        assert isinstance(result, httpx.Response) and result.status_code == 201
        assert len(server.seen) == 2


def test_slow_body_on_a_503_is_bounded_by_the_attempt_and_retried(mode: str) -> None:
    body = json.dumps({"code": "idempotency_store_unavailable", "pad": "x" * 400}).encode()
    slow = Step(503, {"content-type": "application/problem+json"}, body, fault="slow", chunk=16, interval=0.1)
    policy = RetryPolicy(backoff=FAST, attempt_timeout=0.3)
    with FaultServer(slow, OK) as server:
        result, _, took = call(mode, "POST", server.url + "/v1/payments", policy, content=b"{}")
        assert isinstance(result, httpx.Response) and result.status_code == 201
        assert len(server.seen) == 2
        # The body would take 2.8 s to arrive; the attempt gave up on it at about 0.3 s.
        assert took < 2.0


def test_slow_body_that_arrives_in_time_is_read(mode: str) -> None:
    body = json.dumps({"code": "idempotency_request_in_flight", "retryable": True}).encode()
    slow = Step(409, {"content-type": "application/problem+json", "retry-after": "0"}, body, fault="slow", chunk=20, interval=0.02)
    with FaultServer(slow, OK) as server:
        result, transport, _ = call(mode, "POST", server.url + "/v1/payments", content=b"{}")
        assert isinstance(result, httpx.Response) and result.status_code == 201
        assert len(server.seen) == 2
        assert transport.budget.available == 500  # the throttle price, refunded by the success


def test_retry_after_is_waited_over_real_sockets(mode: str) -> None:
    with FaultServer(Step(429, {"retry-after": "1"}), OK) as server:
        result, _, _ = call(mode, "GET", server.url + "/v1/payments/pay_1")
        assert isinstance(result, httpx.Response) and result.status_code == 201
        gap = server.seen[1].arrived - server.seen[0].ended
        assert gap >= 0.95


def test_no_connection_leaks_and_the_final_body_streams(mode: str) -> None:
    problem = json.dumps({"code": "server_shutting_down", "retryable": True}).encode()
    big = b"y" * 200_000
    steps = (
        Step(503, {"content-type": "application/problem+json"}, problem),
        Step(503, {"content-type": "text/plain"}, b"unavailable " * 100),
        Step(200, {"content-type": "application/octet-stream"}, big),
    )
    with FaultServer(*steps) as server:
        if mode == "sync":
            base = httpx.HTTPTransport()
            transport: Any = oncely.RetryTransport(base, RetryPolicy(backoff=FAST))
            with httpx.Client(transport=transport) as client:
                with client.stream("GET", server.url + "/report") as r:
                    got = b"".join(r.iter_bytes())
                pool = base._pool.connections  # what httpcore still holds
                assert all(c.is_idle() for c in pool), pool
        else:

            async def run() -> bytes:
                base = httpx.AsyncHTTPTransport()
                transport = oncely.AsyncRetryTransport(base, RetryPolicy(backoff=FAST))
                async with httpx.AsyncClient(transport=transport) as client:
                    async with client.stream("GET", server.url + "/report") as r:
                        got = b"".join([c async for c in r.aiter_bytes()])
                    pool = base._pool.connections
                    assert all(c.is_idle() for c in pool), pool
                return got

            got = asyncio.run(run())
        assert got == big
        assert len(server.seen) == 3
        # The fully read problem body let its connection be reused; the unread text one was
        # closed: two connections for three attempts, and none left open once the client closed.
        assert server.connections == 2
        assert server.wait_closed()


def test_a_problem_body_read_for_classification_is_handed_back(mode: str) -> None:
    body = json.dumps({"type": "about:blank", "status": 422, "code": "validation_failed", "retryable": False}).encode()
    with FaultServer(Step(422, {"content-type": "application/problem+json"}, body)) as server:
        result, _, _ = call(mode, "POST", server.url + "/v1/payments", content=b"{}")
        assert isinstance(result, httpx.Response)
        assert result.status_code == 422 and result.content == body
        assert len(server.seen) == 1
