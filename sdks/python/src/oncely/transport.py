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
import math
import random
import threading
from dataclasses import dataclass, field
from typing import (
    AsyncIterator,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Type,
    Union,
)

import httpx

from . import errors
from .budget import RetryBudget
from .classify import (
    AFTER_SEND,
    BEFORE_SEND,
    CONNECT,
    DONE,
    NOT_RETRYABLE,
    OTHER,
    OUTCOME_UNKNOWN,
    RESET,
    TIMEOUT,
    Classifier,
    Problem,
    ResponseFacts,
    Retry,
    Verdict,
    classify_response,
    classify_transport,
    safe_to_repeat,
)
from .clock import Clock, SystemClock
from .key import (
    IDEMPOTENCY_KEY,
    KeyRuleError,
    check_key,
    has_surrounding_whitespace,
    needs_key,
    parse_key,
    uuid4_key,
)
from .policy import EXTENSION, CallOptions, RetryPolicy
from .retry_after import retry_after_from_values
from .schedule import RETRY_AFTER, CallState, RetryPlan, Stop, deadline_exhausted

__all__ = ["ACTIVE_EXTENSION", "AsyncRetryTransport", "MAX_PROBLEM_BODY", "RetryTransport"]

logger = logging.getLogger("oncely")
# A library adds no handler but this one (the logging HOWTO): the application decides.
logger.addHandler(logging.NullHandler())

#: Largest problem+json body read for classification, in bytes (64 KiB).
MAX_PROBLEM_BODY = 64 * 1024

#: The request extension an outer transport of ours sets for the length of one logical call;
#: an inner one that sees it passes through (and counts what goes out).
ACTIVE_EXTENSION = "oncely.active"

_KEY_HEADER = IDEMPOTENCY_KEY.lower().encode("ascii")

_ERRORS: Dict[str, Type[errors.RetryError]] = {
    "deadline_exhausted": errors.DeadlineExhausted,
    "attempts_exhausted": errors.AttemptsExhausted,
    "budget_empty": errors.BudgetExhausted,
    "not_retryable": errors.NotRetryable,
    "outcome_unknown": errors.OutcomeUnknown,
    "body_not_replayable": errors.BodyNotReplayable,
    "invalid_idempotency_key": errors.InvalidIdempotencyKey,
    "nested_retry_layer": errors.NestedRetryLayer,
}

_OUTCOME_UNKNOWN_TEXT = (
    "outcome unknown: the request was sent and may have taken effect; it was not retried "
    "because it is not safe to repeat without an idempotency key"
)
_NOT_RETRYABLE_TEXT = "failure is not retryable"
_NOT_REPLAYABLE_TEXT = (
    "request body is a stream and cannot be resent, so it was sent once and not retried"
)


class _Default:
    """The "take it from the policy" marker of ``budget=``."""


_FROM_POLICY = _Default()


class _Refused(Exception):
    """An inner transport of ours refused to send (not an httpx error, so that a foreign retry
    layer between the two does not take it for a transient failure)."""

    def __init__(self, deadline: bool, max_sends: int) -> None:
        self.deadline = deadline
        self.max_sends = max_sends
        super().__init__(
            "not sent: the call's deadline has passed"
            if deadline
            else f"not sent: the call's {max_sends} requests are spent (another retry layer "
            "re-sent it)"
        )


class _ActiveCall:
    """What the outer transport shares with everything below it for one logical call."""

    def __init__(self, max_sends: int, end: float, clock: Clock) -> None:
        self.max_sends = max_sends
        self.end = end
        self.clock = clock
        self.sends = 0
        # Attempts answered 409 in flight: each allows one more send, as the schedule does not
        # count them against the attempt limit.
        self.in_flight = 0
        self.last_status: Optional[int] = None
        self._lock = threading.Lock()

    def admit(self) -> None:
        """Counts one send, or raises :class:`_Refused`."""
        if self.clock.monotonic() >= self.end:
            raise _Refused(True, self.max_sends)
        with self._lock:
            if self.sends >= self.max_sends + self.in_flight:
                raise _Refused(False, self.max_sends)
            self.sends += 1


@dataclass
class RetryMetrics:
    """Counters of one transport (shared by its calls). Read them with :meth:`snapshot`."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    retry_after_waits: int = 0
    keys_minted: int = 0
    gave_up: int = 0
    by_reason: Dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def bump(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def gave_up_for(self, reason: str) -> None:
        with self._lock:
            self.gave_up += 1
            self.by_reason[reason] = self.by_reason.get(reason, 0) + 1

    def snapshot(self) -> Dict[str, object]:
        """A copy of the counters: ``calls``, ``attempts``, ``retries``, ``retry_after_waits``,
        ``keys_minted``, ``gave_up`` and ``by_reason`` (each error ``reason`` to its count)."""
        with self._lock:
            return {
                "calls": self.calls,
                "attempts": self.attempts,
                "retries": self.retries,
                "retry_after_waits": self.retry_after_waits,
                "keys_minted": self.keys_minted,
                "gave_up": self.gave_up,
                "by_reason": dict(self.by_reason),
            }


@dataclass
class _Outcome:
    """One attempt's result, classified."""

    verdict: Verdict
    response: Optional[httpx.Response] = None
    hint: Optional[float] = None
    problem: Optional[Problem] = None
    error: Optional[BaseException] = None
    stop: Optional[Stop] = None


@dataclass
class _Step:
    """What the loop does next: return ``response``, or close ``close`` and then raise
    ``error``, or close ``close`` and sleep ``plan``."""

    response: Optional[httpx.Response] = None
    close: Optional[httpx.Response] = None
    error: Optional[errors.RetryError] = None
    cause: Optional[BaseException] = None
    plan: Optional[RetryPlan] = None


def _seconds_or_none(value: float) -> Optional[float]:
    return None if math.isinf(value) else value


#: httpx's own default timeouts (``httpx.Timeout(5.0)``), which every client without a
#: ``timeout=`` argument puts on each request.
_HTTPX_DEFAULT_TIMEOUTS = httpx.Timeout(5.0).as_dict()


def _caller_timeouts(value: object) -> Mapping[str, object]:
    """The timeouts of the request that cap each attempt: the caller's own. httpx's default
    (5 s for each of the four) is not a choice of the caller but what every client without a
    ``timeout=`` carries: it would cut the policy's attempt timeout (10 s) in half, so it is left
    out, and each attempt gets ``min(attempt timeout, time left)`` (``docs/CONTRACT.md``,
    "Retrying"). A caller who wants 5 s attempts says so with ``attempt_timeout=5.0``."""
    if not isinstance(value, Mapping) or dict(value) == _HTTPX_DEFAULT_TIMEOUTS:
        return {}
    return value


def _cut(value: object, limit: float) -> Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _seconds_or_none(min(float(value), limit))
    return _seconds_or_none(limit)


def _transport_kind(error: BaseException) -> tuple[str, str]:
    """The phase and kind of an httpx transport error."""
    if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return BEFORE_SEND, CONNECT
    if isinstance(error, httpx.ProxyError):
        return BEFORE_SEND, CONNECT
    if isinstance(error, httpx.TimeoutException):
        return AFTER_SEND, TIMEOUT
    if isinstance(error, (httpx.NetworkError, httpx.RemoteProtocolError)):
        return AFTER_SEND, RESET
    return BEFORE_SEND, OTHER


def _in_chain(error: BaseException, kind: type) -> Optional[BaseException]:
    seen = 0
    current: Optional[BaseException] = error
    while current is not None and seen < 32:
        if isinstance(current, kind):
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def _is_json(headers: httpx.Headers) -> bool:
    return "json" in headers.get("content-type", "").lower()


def _declared_small(headers: httpx.Headers) -> bool:
    values = headers.get_list("content-length")
    if not values:
        return True
    try:
        return all(int(v) <= MAX_PROBLEM_BODY for v in values)
    except ValueError:
        return False


def _header_map(headers: httpx.Headers) -> Dict[str, List[str]]:
    out: Dict[str, List[str]] = {}
    for name, value in headers.multi_items():
        out.setdefault(name.lower(), []).append(value)
    return out


def _decoded(body: bytes, headers: httpx.Headers) -> Optional[bytes]:
    """The body with its ``Content-Encoding`` undone (httpx's decoders), or ``None``."""
    encoding = headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return body
    probe = httpx.Response(
        200, headers=[("content-encoding", encoding)], stream=httpx.ByteStream(body)
    )
    try:
        return probe.read()
    except httpx.DecodingError:
        return None


class _Replayed(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body rebuilt after inspection: the bytes already read, then the rest of the
    original body (or the error that broke it)."""

    def __init__(
        self,
        prefix: bytes,
        original: Union[httpx.SyncByteStream, httpx.AsyncByteStream],
        rest: Union[Iterator[bytes], AsyncIterator[bytes], None],
        failure: Optional[BaseException],
    ) -> None:
        self._prefix = prefix
        self._original = original
        self._rest = rest
        self._failure = failure

    def __iter__(self) -> Iterator[bytes]:
        if self._prefix:
            yield self._prefix
        if self._failure is not None:
            raise self._failure
        if self._rest is not None:
            assert isinstance(self._rest, Iterator)
            yield from self._rest

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._prefix:
            yield self._prefix
        if self._failure is not None:
            raise self._failure
        if self._rest is not None:
            assert isinstance(self._rest, AsyncIterator)
            async for chunk in self._rest:
                yield chunk

    def close(self) -> None:
        if isinstance(self._original, httpx.SyncByteStream):
            self._original.close()

    async def aclose(self) -> None:
        if isinstance(self._original, httpx.AsyncByteStream):
            await self._original.aclose()


def _rebuilt(response: httpx.Response, stream: Union[httpx.SyncByteStream, httpx.AsyncByteStream]) -> httpx.Response:
    return httpx.Response(
        response.status_code,
        headers=response.headers,
        stream=stream,
        extensions=response.extensions,
    )


class _Core:
    """The shared state of one transport: policy, budget, clock, random source, key maker,
    classifier and counters."""

    def __init__(
        self,
        policy: Optional[RetryPolicy],
        budget: Union[RetryBudget, None, _Default],
        clock: Optional[Clock],
        rng_seed: Optional[int],
        key_maker: Optional[Callable[[], str]],
        classifier: Optional[Classifier],
    ) -> None:
        self.policy = policy if policy is not None else RetryPolicy()
        if isinstance(budget, _Default):
            config = self.policy.budget
            self.budget: Optional[RetryBudget] = None if config is None else RetryBudget(config)
        else:
            self.budget = budget
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.rng = random.Random(rng_seed)
        self.key_maker = key_maker if key_maker is not None else uuid4_key
        self.classifier = classifier
        self.metrics = RetryMetrics()


class _Call:
    """One logical call: everything but the I/O, which the sync and async loops do."""

    def __init__(self, core: _Core, request: httpx.Request) -> None:
        self.core = core
        self.request = request
        self.options = CallOptions.from_extension(request.extensions.get(EXTENSION))
        self.policy = self.options.apply(core.policy)
        self.state = CallState(core.clock.monotonic(), self.policy.deadline)
        core.metrics.bump("calls")
        self.method = request.method.upper()
        self.path = request.url.path
        self.key: Optional[str] = None
        self.original_timeout = request.extensions.get("timeout")
        base = self.original_timeout
        self.base_timeout: Mapping[str, object] = _caller_timeouts(base)
        self.attempt_timeouts: Dict[str, Optional[float]] = {}
        self.active = _ActiveCall(
            self.policy.max_attempts, self.state.start + self.policy.deadline, core.clock
        )
        self._set_key()
        self.has_key = self.key is not None
        self.safe = safe_to_repeat(self.method, self.has_key)
        self.replayable = isinstance(request.stream, httpx.ByteStream)

    # -- keys -------------------------------------------------------------------------------

    def _raw_keys(self) -> List[bytes]:
        return [v for k, v in self.request.headers.raw if k.lower() == _KEY_HEADER]

    def _set_key(self) -> None:
        wanted = self.options.idempotency_key
        raw = self._raw_keys()
        given = raw + ([] if wanted is None else [wanted.encode("utf-8")])
        spaced = next((v for v in given if has_surrounding_whitespace(v)), None)
        if spaced is not None:
            raise self.error(
                Stop(
                    "invalid_idempotency_key",
                    "invalid idempotency key, nothing sent: the key has leading or trailing "
                    "whitespace, which the server drops (RFC 9110 section 5.5), so it would store "
                    "another key than this one",
                ),
                key=spaced.decode("latin-1"),
            )
        if wanted is not None:
            try:
                parse_key(wanted.encode("utf-8"))
            except KeyRuleError as e:
                raise self.error(
                    Stop("invalid_idempotency_key", f"invalid idempotency key, nothing sent: {e}"),
                    key=wanted,
                ) from None
            if raw and raw != [wanted.encode("utf-8")]:
                raise self.error(
                    Stop(
                        "invalid_idempotency_key",
                        "invalid idempotency key, nothing sent: the request has an "
                        "Idempotency-Key header and the call options another",
                    ),
                    key=wanted,
                )
            if not raw:
                self.request.headers[IDEMPOTENCY_KEY] = wanted
                raw = self._raw_keys()
        if raw:
            try:
                check_key(raw)
            except KeyRuleError as e:
                raise self.error(
                    Stop("invalid_idempotency_key", f"invalid idempotency key, nothing sent: {e}"),
                    key=raw[0].decode("latin-1"),
                ) from None
            self.key = raw[0].decode("ascii")
            return
        if self.policy.mint_keys and needs_key(self.method):
            minted = self.core.key_maker()
            try:
                parse_key(minted.encode("utf-8"))
            except (KeyRuleError, AttributeError) as e:
                raise self.error(
                    Stop("invalid_idempotency_key", f"invalid idempotency key, nothing sent: {e}"),
                    key=str(minted),
                ) from None
            self.request.headers[IDEMPOTENCY_KEY] = minted
            self.key = minted
            self.core.metrics.bump("keys_minted")

    # -- errors -----------------------------------------------------------------------------

    def error(
        self,
        stop: Stop,
        last_status: Optional[int] = None,
        problem: Optional[Problem] = None,
        cause: Optional[BaseException] = None,
        key: Optional[str] = None,
    ) -> errors.RetryError:
        """Ends the call: counts it, logs it at ``WARNING`` and builds the error."""
        elapsed = self.state.elapsed(self.core.clock.monotonic())
        key = key if key is not None else self.key
        self.core.metrics.gave_up_for(stop.kind)
        budget = self.core.budget
        logger.warning(
            "oncely: giving up on %s %s: %s (attempts %d, last status %s, %d ms, "
            "Idempotency-Key %s)",
            self.method,
            self.path,
            stop.message,
            self.state.attempts,
            last_status,
            int(elapsed * 1000),
            key,
            extra={
                "oncely_reason": stop.kind,
                "oncely_attempts": self.state.attempts,
                "oncely_last_status": last_status,
                "oncely_elapsed": elapsed,
                "oncely_tokens_left": None if budget is None else budget.available,
                "oncely_idempotency_key": key,
                "oncely_error": None if cause is None else repr(cause),
            },
        )
        err: errors.RetryError
        if stop.kind == "retry_after_beyond_deadline":
            err = errors.RetryAfterBeyondDeadline(
                stop.message,
                hint=stop.fields["hint"],
                remaining=stop.fields["remaining"],
                attempts=self.state.attempts,
                elapsed=elapsed,
                last_status=last_status,
                idempotency_key=key,
                problem=problem,
                request=self.request,
            )
        else:
            err = _ERRORS[stop.kind](
                stop.message,
                attempts=self.state.attempts,
                elapsed=elapsed,
                last_status=last_status,
                idempotency_key=key,
                problem=problem,
                request=self.request,
            )
        if cause is not None:
            err.__cause__ = cause
        return err

    # -- one attempt ------------------------------------------------------------------------

    def begin_attempt(self) -> float:
        """Starts an attempt: its time limit in seconds, with the request's timeouts cut to
        it. Raises the deadline error when no time is left."""
        now = self.core.clock.monotonic()
        limit = self.state.attempt_limit(now, self.policy.attempt_timeout)
        if limit <= 0:
            raise self.error(deadline_exhausted(self.policy.deadline))
        connect = min(limit, self.policy.effective_connect_timeout)
        base = self.base_timeout
        self.attempt_timeouts = {
            "connect": _cut(base.get("connect"), connect),
            "read": _cut(base.get("read"), limit),
            "write": _cut(base.get("write"), limit),
            "pool": _cut(base.get("pool"), limit),
        }
        self.request.extensions["timeout"] = dict(self.attempt_timeouts)
        self.state.record_attempt()
        self.core.metrics.bump("attempts")
        return limit

    def failed(self, error: BaseException) -> Optional[_Outcome]:
        """Classifies an attempt that raised: our refusal, a transport error, or another
        layer's error around one (classified by that root cause). ``None`` for an error with
        no httpx error in its chain: a bug, raised to the caller unchanged."""
        refused = _in_chain(error, _Refused)
        if isinstance(refused, _Refused):
            if refused.deadline:
                stop = deadline_exhausted(self.policy.deadline)
            else:
                stop = self._nested(self.policy.max_attempts)
            return _Outcome(verdict=NOT_RETRYABLE, error=error, stop=stop)
        root = _in_chain(error, httpx.HTTPError)
        if root is None:
            return None
        phase, kind = _transport_kind(root)
        return _Outcome(verdict=classify_transport(self.safe, phase, kind), error=error)

    def timed_out(self, limit: float) -> _Outcome:
        """The attempt ran past its limit (the async transport's own bound)."""
        error = httpx.ReadTimeout(
            f"attempt timed out after {int(limit * 1000)} ms", request=self.request
        )
        return _Outcome(verdict=classify_transport(self.safe, AFTER_SEND, TIMEOUT), error=error)

    def responded(self, response: httpx.Response, problem: Optional[Problem]) -> _Outcome:
        """Classifies an attempt that got a response."""
        hint = retry_after_from_values(
            response.headers.get_list("retry-after"), self.core.clock.time()
        )
        facts = ResponseFacts(response.status_code, _header_map(response.headers), problem)
        classifier = self.core.classifier
        verdict = classify_response(
            self.method, self.has_key, facts, self.policy.retry_500, classifier
        )
        return _Outcome(verdict=verdict, response=response, hint=hint, problem=problem)

    def wants_problem(self, response: httpx.Response) -> bool:
        """Whether the body is read to classify the response: an error status with a JSON body
        of at most 64 KiB."""
        return (
            response.status_code >= 400
            and _is_json(response.headers)
            and _declared_small(response.headers)
        )

    def read_left(self, started: float, limit: float) -> float:
        """Seconds left of the attempt that started at ``started``."""
        return limit - (self.core.clock.monotonic() - started)

    def problem_of(self, body: bytes, headers: httpx.Headers) -> Optional[Problem]:
        decoded = _decoded(body, headers)
        return None if decoded is None else Problem.from_json(decoded)

    def _nested(self, requests: int) -> Stop:
        return Stop(
            "nested_retry_layer",
            f"another retry layer below this one re-sent the request ({requests} requests in "
            "all); two retry layers in one stack are not supported, so this one did not retry",
            requests=requests,
        )

    # -- deciding ---------------------------------------------------------------------------

    def decide(self, outcome: _Outcome, sends_before: int) -> _Step:
        """What follows an attempt: return, give up, or retry after a planned sleep."""
        sent = self.active.sends - sends_before
        response = outcome.response
        done = response is not None and outcome.verdict == DONE
        if not done and sent > 1:
            outcome.stop = self._nested(self.active.sends)
        if outcome.stop is not None:
            self.state.attempts = max(self.state.attempts, int(outcome.stop.fields.get("requests", 0)))
            last = self.active.last_status if response is None else response.status_code
            return _Step(
                close=response,
                error=self.error(outcome.stop, last, outcome.problem, outcome.error),
                cause=outcome.error,
            )
        if response is not None and outcome.verdict == DONE:
            if response.status_code < 500:
                self.state.on_success(self.core.budget)
            return _Step(response=response)
        if response is None and outcome.verdict == OUTCOME_UNKNOWN:
            stop = Stop("outcome_unknown", _OUTCOME_UNKNOWN_TEXT)
            return _Step(error=self.error(stop, cause=outcome.error), cause=outcome.error)
        if not isinstance(outcome.verdict, Retry):
            stop = Stop("not_retryable", _NOT_RETRYABLE_TEXT)
            return _Step(error=self.error(stop, cause=outcome.error), cause=outcome.error)
        reason = outcome.verdict.reason
        last_status = None if response is None else response.status_code
        if not self.replayable:
            stop = Stop("body_not_replayable", _NOT_REPLAYABLE_TEXT)
            err = self.error(stop, last_status, outcome.problem, outcome.error)
            return _Step(close=response, error=err, cause=outcome.error)
        core = self.core
        if reason.kind == "in_flight":
            with self.active._lock:
                self.active.in_flight += 1
        try:
            plan = self.state.plan_retry(
                self.policy, core.budget, reason, outcome.hint, core.clock.monotonic(), core.rng
            )
        except Stop as stop:
            err = self.error(stop, last_status, outcome.problem, outcome.error)
            return _Step(close=response, error=err, cause=outcome.error)
        core.metrics.bump("retries")
        if plan.source == RETRY_AFTER:
            core.metrics.bump("retry_after_waits")
        error_text = None if outcome.error is None else f"{type(outcome.error).__name__}: {outcome.error}"
        logger.info(
            "oncely: retrying %s %s: attempt %d of %d failed (%s), waiting %.3f s (%s), "
            "Idempotency-Key %s",
            self.method,
            self.path,
            self.state.attempts,
            self.policy.max_attempts,
            reason if error_text is None else f"{reason}: {error_text}",
            plan.wait,
            plan.source,
            self.key,
            extra={
                "oncely_attempt": self.state.attempts,
                "oncely_next_attempt": self.state.attempts + 1,
                "oncely_reason": str(reason),
                "oncely_status": last_status,
                "oncely_error": error_text,
                "oncely_method": self.method,
                "oncely_path": self.path,
                "oncely_wait": plan.wait,
                "oncely_wait_source": plan.source,
                "oncely_backoff": plan.backoff,
                "oncely_retry_after": plan.hint,
                "oncely_tokens_left": plan.tokens_left,
                "oncely_retry_cost": plan.cost,
                "oncely_idempotency_key": self.key,
            },
        )
        return _Step(close=response, plan=plan)

    def end(self) -> None:
        """Ends the call: the request's own timeouts come back (a redirect, and the reads of
        the returned response's body, use the client's timeouts), the marker goes."""
        ext = self.request.extensions
        if self.original_timeout is None:
            ext.pop("timeout", None)
        else:
            ext["timeout"] = self.original_timeout
        if ext.get(ACTIVE_EXTENSION) is self.active:
            del ext[ACTIVE_EXTENSION]

    def refund(self, plan: RetryPlan) -> None:
        """Gives a retry's tokens back: the call stopped during its sleep and never used it."""
        budget = self.core.budget
        if budget is not None and plan.cost:
            budget.deposit(plan.cost)
            logger.debug(
                "oncely: call cancelled while waiting; %d tokens refunded", plan.cost,
                extra={"oncely_idempotency_key": self.key},
            )


class _TransportBase:
    """The configuration both transports share."""

    _core: _Core

    @property
    def policy(self) -> RetryPolicy:
        """The policy."""
        return self._core.policy

    @property
    def budget(self) -> Optional[RetryBudget]:
        """The retry budget shared by every call of this transport (``None``: disabled)."""
        return self._core.budget

    @property
    def metrics(self) -> RetryMetrics:
        """The counters of this transport."""
        return self._core.metrics


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
        budget: Union[RetryBudget, None, _Default] = _FROM_POLICY,
        clock: Optional[Clock] = None,
        rng_seed: Optional[int] = None,
        key_maker: Optional[Callable[[], str]] = None,
        classifier: Optional[Classifier] = None,
    ) -> None:
        self._inner = transport if transport is not None else httpx.HTTPTransport()
        self._core = _Core(policy, budget, clock, rng_seed, key_maker, classifier)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        active = request.extensions.get(ACTIVE_EXTENSION)
        if isinstance(active, _ActiveCall):
            # An outer transport of ours runs this call's retry loop.
            active.admit()
            logger.debug("oncely: an outer RetryTransport is retrying this call; passing through")
            response = self._inner.handle_request(request)
            active.last_status = response.status_code
            return response
        call = _Call(self._core, request)
        request.extensions[ACTIVE_EXTENSION] = call.active
        try:
            return self._run(call)
        finally:
            call.end()

    def _run(self, call: _Call) -> httpx.Response:
        clock = self._core.clock
        request = call.request
        while True:
            limit = call.begin_attempt()
            sends_before = call.active.sends
            started = clock.monotonic()
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
                outcome = self._inspect(call, response, started, limit)
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

    def _inspect(
        self, call: _Call, response: httpx.Response, started: float, limit: float
    ) -> _Outcome:
        if not call.wants_problem(response):
            return call.responded(response, None)
        try:
            response, problem = self._read_problem(call, response, started, limit)
        except BaseException:
            response.close()
            raise
        return call.responded(response, problem)

    def _read_problem(
        self, call: _Call, response: httpx.Response, started: float, limit: float
    ) -> tuple[httpx.Response, Optional[Problem]]:
        stream = response.stream
        assert isinstance(stream, httpx.SyncByteStream)
        chunks = iter(stream)
        buf = bytearray()
        failure: Optional[BaseException] = None
        complete = False
        timeouts = call.request.extensions.get("timeout")
        try:
            while True:
                left = call.read_left(started, limit)
                if left <= 0:
                    break
                if isinstance(timeouts, dict):
                    # httpcore reads the timeout from the request before each read.
                    timeouts["read"] = _cut(call.attempt_timeouts.get("read"), left)
                try:
                    chunk = next(chunks)
                except StopIteration:
                    complete = True
                    break
                buf += chunk
                if len(buf) > MAX_PROBLEM_BODY:
                    break
        except httpx.HTTPError as e:
            failure = e
        finally:
            if isinstance(timeouts, dict):
                timeouts["read"] = call.attempt_timeouts.get("read")
        _log_body(response.status_code, complete, failure, len(buf), limit)
        if complete:
            stream.close()
            body = bytes(buf)
            return _rebuilt(response, httpx.ByteStream(body)), call.problem_of(body, response.headers)
        rest = None if failure is not None else chunks
        return _rebuilt(response, _Replayed(bytes(buf), stream, rest, failure)), None

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
        budget: Union[RetryBudget, None, _Default] = _FROM_POLICY,
        clock: Optional[Clock] = None,
        rng_seed: Optional[int] = None,
        key_maker: Optional[Callable[[], str]] = None,
        classifier: Optional[Classifier] = None,
    ) -> None:
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()
        self._core = _Core(policy, budget, clock, rng_seed, key_maker, classifier)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        active = request.extensions.get(ACTIVE_EXTENSION)
        if isinstance(active, _ActiveCall):
            active.admit()
            logger.debug(
                "oncely: an outer AsyncRetryTransport is retrying this call; passing through"
            )
            response = await self._inner.handle_async_request(request)
            active.last_status = response.status_code
            return response
        call = _Call(self._core, request)
        request.extensions[ACTIVE_EXTENSION] = call.active
        try:
            return await self._run(call)
        finally:
            call.end()

    async def _run(self, call: _Call) -> httpx.Response:
        clock = self._core.clock
        request = call.request
        while True:
            limit = call.begin_attempt()
            sends_before = call.active.sends
            started = clock.monotonic()
            try:
                response = await asyncio.wait_for(
                    self._inner.handle_async_request(request), _seconds_or_none(limit)
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
                outcome = await self._inspect(call, response, started, limit)
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

    async def _inspect(
        self, call: _Call, response: httpx.Response, started: float, limit: float
    ) -> _Outcome:
        if not call.wants_problem(response):
            return call.responded(response, None)
        try:
            response, problem = await self._read_problem(call, response, started, limit)
        except BaseException:
            await response.aclose()
            raise
        return call.responded(response, problem)

    async def _read_problem(
        self, call: _Call, response: httpx.Response, started: float, limit: float
    ) -> tuple[httpx.Response, Optional[Problem]]:
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        chunks = stream.__aiter__()
        buf = bytearray()
        state = {"complete": False}

        async def read() -> None:
            while True:
                if call.read_left(started, limit) <= 0:
                    return
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    state["complete"] = True
                    return
                buf.extend(chunk)
                if len(buf) > MAX_PROBLEM_BODY:
                    return

        failure: Optional[BaseException] = None
        left = call.read_left(started, limit)
        if left > 0:
            try:
                await asyncio.wait_for(read(), _seconds_or_none(left))
            except asyncio.TimeoutError:
                failure = httpx.ReadTimeout(
                    "the error body did not arrive within the attempt's time", request=call.request
                )
            except httpx.HTTPError as e:
                failure = e
        complete = state["complete"]
        _log_body(response.status_code, complete, failure, len(buf), limit)
        if complete:
            await stream.aclose()
            body = bytes(buf)
            return _rebuilt(response, httpx.ByteStream(body)), call.problem_of(body, response.headers)
        rest = None if failure is not None else chunks
        return _rebuilt(response, _Replayed(bytes(buf), stream, rest, failure)), None

    async def aclose(self) -> None:
        await self._inner.aclose()


def _log_body(
    status: int, complete: bool, failure: Optional[BaseException], read: int, limit: float
) -> None:
    if complete:
        return
    if failure is not None:
        logger.warning(
            "oncely: reading the %d error body failed after %d bytes (%s); the status decides",
            status,
            read,
            failure,
        )
    elif read > MAX_PROBLEM_BODY:
        logger.debug("oncely: the %d error body is over 64 KiB, not inspected", status)
    else:
        logger.warning(
            "oncely: the %d error body did not arrive within the attempt's %d ms; the status "
            "decides",
            status,
            int(limit * 1000),
        )
