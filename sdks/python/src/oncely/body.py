"""Problem bodies: reading an error response's problem+json for classification, and handing the
response back intact.

For an error response (status 400 or above) with a JSON body of at most
:data:`MAX_PROBLEM_BODY` bytes (by ``Content-Length``, or counted as it arrives), the attempt
reads the body within what is left of its time, for the problem+json (RFC 9457) ``code`` and
``retryable`` fields. A body that breaks, stalls or is too large never changes the verdict: the
status and the headers decide, and the response returned to the caller still yields the bytes
that arrived, then the same error (:class:`Replayed`). The Rust SDK reads it the same way
(``crates/oncely-client/src/middleware/body.rs``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Callable, Iterator, Optional, Union

import httpx

from .classify import Problem
from .timeouts import cut, seconds_or_none

__all__ = ["MAX_PROBLEM_BODY", "Replayed", "ainspect_problem", "inspect_problem"]

logger = logging.getLogger("oncely")

#: Largest problem+json body read for classification, in bytes (64 KiB).
MAX_PROBLEM_BODY = 64 * 1024


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


def _wants_problem(response: httpx.Response) -> bool:
    """Whether the body is read to classify the response: an error status with a JSON body
    of at most 64 KiB."""
    return (
        response.status_code >= 400
        and _is_json(response.headers)
        and _declared_small(response.headers)
    )


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


def _problem_of(body: bytes, headers: httpx.Headers) -> Optional[Problem]:
    decoded = _decoded(body, headers)
    return None if decoded is None else Problem.from_json(decoded)


class Replayed(httpx.SyncByteStream, httpx.AsyncByteStream):
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


def _rebuilt(
    response: httpx.Response, stream: Union[httpx.SyncByteStream, httpx.AsyncByteStream]
) -> httpx.Response:
    return httpx.Response(
        response.status_code,
        headers=response.headers,
        stream=stream,
        extensions=response.extensions,
    )


def inspect_problem(
    response: httpx.Response,
    request: httpx.Request,
    left: Callable[[], float],
    read_timeout: Optional[float],
    limit: float,
) -> tuple[httpx.Response, Optional[Problem]]:
    """Reads the problem of an error response (sync): the response to hand on (rebuilt when its
    body was read) and its problem, if the whole body arrived and is one.

    ``left()`` is the time left of the attempt (``limit`` seconds in all), in seconds; each read
    is bounded by it (the request's ``read`` timeout, which httpcore reads before each read, is
    cut to it, then set back to ``read_timeout``). Closes the response if reading raises
    anything but an httpx error (a cancellation, a bug) and raises that."""
    if not _wants_problem(response):
        return response, None
    try:
        return _read_problem(response, request, left, read_timeout, limit)
    except BaseException:
        response.close()
        raise


def _read_problem(
    response: httpx.Response,
    request: httpx.Request,
    left: Callable[[], float],
    read_timeout: Optional[float],
    limit: float,
) -> tuple[httpx.Response, Optional[Problem]]:
    stream = response.stream
    assert isinstance(stream, httpx.SyncByteStream)
    chunks = iter(stream)
    buf = bytearray()
    failure: Optional[BaseException] = None
    complete = False
    timeouts = request.extensions.get("timeout")
    try:
        while True:
            remaining = left()
            if remaining <= 0:
                break
            if isinstance(timeouts, dict):
                # httpcore reads the timeout from the request before each read.
                timeouts["read"] = cut(read_timeout, remaining)
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
            timeouts["read"] = read_timeout
    _log_body(response.status_code, complete, failure, len(buf), limit)
    if complete:
        stream.close()
        body = bytes(buf)
        return _rebuilt(response, httpx.ByteStream(body)), _problem_of(body, response.headers)
    rest = None if failure is not None else chunks
    return _rebuilt(response, Replayed(bytes(buf), stream, rest, failure)), None


async def ainspect_problem(
    response: httpx.Response,
    request: httpx.Request,
    left: Callable[[], float],
    limit: float,
) -> tuple[httpx.Response, Optional[Problem]]:
    """The asyncio twin of :func:`inspect_problem`: the whole read is bounded by ``left()``
    seconds with ``asyncio.wait_for``."""
    if not _wants_problem(response):
        return response, None
    try:
        return await _aread_problem(response, request, left, limit)
    except BaseException:
        await response.aclose()
        raise


async def _aread_problem(
    response: httpx.Response,
    request: httpx.Request,
    left: Callable[[], float],
    limit: float,
) -> tuple[httpx.Response, Optional[Problem]]:
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    chunks = stream.__aiter__()
    buf = bytearray()
    state = {"complete": False}

    async def read() -> None:
        while True:
            if left() <= 0:
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
    remaining = left()
    if remaining > 0:
        try:
            await asyncio.wait_for(read(), seconds_or_none(remaining))
        except asyncio.TimeoutError:
            failure = httpx.ReadTimeout(
                "the error body did not arrive within the attempt's time", request=request
            )
        except httpx.HTTPError as e:
            failure = e
    complete = state["complete"]
    _log_body(response.status_code, complete, failure, len(buf), limit)
    if complete:
        await stream.aclose()
        body = bytes(buf)
        return _rebuilt(response, httpx.ByteStream(body)), _problem_of(body, response.headers)
    rest = None if failure is not None else chunks
    return _rebuilt(response, Replayed(bytes(buf), stream, rest, failure)), None


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
