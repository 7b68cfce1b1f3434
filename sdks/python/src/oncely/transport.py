"""The httpx face: :class:`RetryTransport` and :class:`AsyncRetryTransport`.

Each wraps another httpx transport (by default ``httpx.HTTPTransport()`` /
``httpx.AsyncHTTPTransport()``), so a client keeps its auth, hooks, cookies and redirects::

    client = httpx.Client(transport=oncely.RetryTransport())
    response = client.post("https://api.example.com/v1/payments", json={"amount": 1000})

What one logical call (one ``client.send``) does:

1. Starts the deadline (policy default 30 s, or ``extensions={"oncely": CallOptions(...)}``).
2. Checks a caller's ``Idempotency-Key`` with the server's rules (1 to 255 visible ASCII
   characters, sent once); a bad one raises :class:`~oncely.InvalidIdempotencyKey` before
   anything is sent.
3. For ``POST`` and ``PATCH`` without a key, mints one (UUID v4, unless the policy or the call
   options say not to) and sets it on the request: every attempt of the call carries it.
4. Sends an attempt whose httpx timeouts (``request.extensions["timeout"]``: connect, read,
   write, pool) are each cut to ``min(caller's, attempt timeout, time left)``, the connect
   timeout also to the policy's 3 s. httpx's timeouts bound each network operation; the async
   transport also bounds the whole attempt (until the response headers) with
   ``asyncio.wait_for``.
5. Classifies the outcome (:mod:`oncely.classify`). For an error response (status 400 or
   above) with a JSON body of at most 64 KiB (by ``Content-Length``, or counted as it arrives),
   it reads the body, within what is left of the attempt's time, for the problem+json ``code``
   and ``retryable`` fields, and hands the response back intact. A body that breaks, stalls or
   is too large never changes the verdict: the status and the headers decide, and a response
   returned to the caller still yields the bytes that arrived, then the same error.
6. Returns the response, raises a :class:`~oncely.RetryError`, or plans a retry
   (:mod:`oncely.schedule`), logs it on the ``oncely`` logger at ``INFO`` (attempt, cause, next
   wait and why, tokens left, key), closes the retried response and sleeps. A call cancelled
   during that sleep (``asyncio`` cancellation, ``KeyboardInterrupt``) stops at once and gives
   the retry's tokens back to the budget: it never used the retry it paid for.

Responses that are not retried (2xx, 3xx, 4xx, a ``retryable: false`` problem) are returned as
they are, whatever their status. A retryable response that ends the call (its last attempt, the
deadline, a budget that cannot pay) raises a :class:`~oncely.RetryError` with ``last_status``
set; its body is closed, as the Rust SDK does.

Bodies: a buffered body (``content=bytes``, ``json=``, ``data=`` without files) is resent byte
for byte. A streaming body (an iterator, a generator, a file upload) is sent once; if that
attempt fails retryably the call ends with :class:`~oncely.BodyNotReplayable`.

Layering: put this transport outermost among retrying pieces. Two of ours in one stack (a vendor
SDK's ``RetryTransport`` inside yours) never multiply: the inner one sees the outer one's call
(a request extension) and passes each attempt straight through, counting what goes out and
refusing sends beyond the call's attempt limit or past its deadline; if another retry layer
between the two re-sent an attempt, the outer one stops with :class:`~oncely.NestedRetryLayer`
instead of retrying.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Optional, Union

import httpx

from . import errors
from .attempt import Attempt
from .body import MAX_PROBLEM_BODY, ainspect_problem, inspect_problem
from .budget import RetryBudget
from .call import FROM_POLICY, Call, Driver, FromPolicy
from .classify import Classifier
from .clock import Clock
from .guard import ACTIVE_EXTENSION, ActiveCall
from .metrics import RetryMetrics
from .policy import RetryPolicy
from .timeouts import seconds_or_none

# ``RetryMetrics`` and ``MAX_PROBLEM_BODY`` are defined beside their concept (:mod:`oncely.metrics`,
# :mod:`oncely.body`) and importable from here too, where they were first.
__all__ = [
    "ACTIVE_EXTENSION",
    "AsyncRetryTransport",
    "MAX_PROBLEM_BODY",
    "RetryMetrics",
    "RetryTransport",
]

logger = logging.getLogger("oncely")


class _TransportBase:
    """The configuration both transports share."""

    _driver: Driver

    @property
    def policy(self) -> RetryPolicy:
        """The policy."""
        return self._driver.policy

    @property
    def budget(self) -> Optional[RetryBudget]:
        """The retry budget shared by every call of this transport (``None``: disabled)."""
        return self._driver.budget

    @property
    def metrics(self) -> RetryMetrics:
        """The counters of this transport."""
        return self._driver.metrics


class RetryTransport(_TransportBase, httpx.BaseTransport):
    """An httpx transport that retries safely: wraps ``transport`` (default
    ``httpx.HTTPTransport()``) with ``policy`` (default :class:`~oncely.RetryPolicy`).

    - ``budget``: the retry budget, by default a new one from ``policy.budget``, shared by every
      call of this transport; pass one :class:`~oncely.RetryBudget` to several transports to
      share it, or ``None`` to disable it.
    - ``clock``: monotonic time, wall time and sleeping (tests plug a virtual one).
    - ``rng_seed``: seeds the jitter's random source, for reproducible delays.
    - ``key_maker``: makes minted keys (default UUID v4); its keys are checked like a caller's.
    - ``classifier``: an extra signal read from error responses after the server's own and
      before the allowlist (``True`` retry, ``False`` do not, ``None`` no opinion).

    Per-call options: ``request.extensions["oncely"]`` (:class:`~oncely.CallOptions`).
    Raises :class:`~oncely.RetryError` subclasses (see :mod:`oncely.errors`).
    """

    def __init__(
        self,
        transport: Optional[httpx.BaseTransport] = None,
        policy: Optional[RetryPolicy] = None,
        *,
        budget: Union[RetryBudget, None, FromPolicy] = FROM_POLICY,
        clock: Optional[Clock] = None,
        rng_seed: Optional[int] = None,
        key_maker: Optional[Callable[[], str]] = None,
        classifier: Optional[Classifier] = None,
    ) -> None:
        self._inner = transport if transport is not None else httpx.HTTPTransport()
        self._driver = Driver(policy, budget, clock, rng_seed, key_maker, classifier)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        active = request.extensions.get(ACTIVE_EXTENSION)
        if isinstance(active, ActiveCall):
            # An outer transport of ours runs this call's retry loop.
            active.admit()
            logger.debug("oncely: an outer RetryTransport is retrying this call; passing through")
            response = self._inner.handle_request(request)
            active.last_status = response.status_code
            return response
        call = Call(self._driver, request)
        request.extensions[ACTIVE_EXTENSION] = call.active
        try:
            return self._run(call)
        finally:
            call.end()

    def _run(self, call: Call) -> httpx.Response:
        clock = self._driver.clock
        request = call.request
        while True:
            limit = call.begin_attempt()
            sends_before = call.active.sends
            started = clock.monotonic()
            outcome: Attempt
            try:
                response = self._inner.handle_request(request)
            except errors.RetryError:
                raise
            except Exception as e:
                failed = call.failed(e)
                if failed is None:
                    raise
                outcome = failed
            else:
                response, problem = inspect_problem(
                    response,
                    request,
                    call.time_left(started, limit),
                    call.attempt_timeouts.get("read"),
                    limit,
                )
                outcome = call.responded(response, problem)
            step = call.decide(outcome, sends_before)
            if step.response is not None:
                return step.response
            if step.close is not None:
                step.close.close()
            if step.error is not None:
                raise step.error from step.cause
            assert step.plan is not None
            try:
                clock.sleep(step.plan.wait)
            except BaseException:
                call.refund(step.plan)
                raise

    def close(self) -> None:
        self._inner.close()


class AsyncRetryTransport(_TransportBase, httpx.AsyncBaseTransport):
    """The asyncio twin of :class:`RetryTransport`: wraps ``transport`` (default
    ``httpx.AsyncHTTPTransport()``), with the same policy, options and errors.

    Each attempt, until its response headers, is also bounded as a whole by
    ``asyncio.wait_for(min(attempt timeout, time left))``. Cancelling the task stops the call at
    once; a cancellation during a backoff sleep gives that retry's tokens back to the budget.
    Needs asyncio (the sleeps and the attempt bound are asyncio's).
    """

    def __init__(
        self,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        policy: Optional[RetryPolicy] = None,
        *,
        budget: Union[RetryBudget, None, FromPolicy] = FROM_POLICY,
        clock: Optional[Clock] = None,
        rng_seed: Optional[int] = None,
        key_maker: Optional[Callable[[], str]] = None,
        classifier: Optional[Classifier] = None,
    ) -> None:
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()
        self._driver = Driver(policy, budget, clock, rng_seed, key_maker, classifier)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        active = request.extensions.get(ACTIVE_EXTENSION)
        if isinstance(active, ActiveCall):
            active.admit()
            logger.debug(
                "oncely: an outer AsyncRetryTransport is retrying this call; passing through"
            )
            response = await self._inner.handle_async_request(request)
            active.last_status = response.status_code
            return response
        call = Call(self._driver, request)
        request.extensions[ACTIVE_EXTENSION] = call.active
        try:
            return await self._run(call)
        finally:
            call.end()

    async def _run(self, call: Call) -> httpx.Response:
        clock = self._driver.clock
        request = call.request
        while True:
            limit = call.begin_attempt()
            sends_before = call.active.sends
            started = clock.monotonic()
            outcome: Attempt
            try:
                response = await asyncio.wait_for(
                    self._inner.handle_async_request(request), seconds_or_none(limit)
                )
            except errors.RetryError:
                raise
            except asyncio.TimeoutError:
                outcome = call.timed_out(limit)
            except Exception as e:
                failed = call.failed(e)
                if failed is None:
                    raise
                outcome = failed
            else:
                response, problem = await ainspect_problem(
                    response, request, call.time_left(started, limit), limit
                )
                outcome = call.responded(response, problem)
            step = call.decide(outcome, sends_before)
            if step.response is not None:
                return step.response
            if step.close is not None:
                await step.close.aclose()
            if step.error is not None:
                raise step.error from step.cause
            assert step.plan is not None
            try:
                await clock.asleep(step.plan.wait)
            except BaseException:
                call.refund(step.plan)
                raise

    async def aclose(self) -> None:
        await self._inner.aclose()
