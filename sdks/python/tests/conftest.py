"""Shared test helpers: a virtual clock and a harness that runs one handler through the sync
or the async transport."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, List, Optional

import httpx
import pytest

import oncely


class FakeClock:
    """A virtual clock: sleeps advance it and are recorded; nothing really waits."""

    def __init__(self, start: float = 1000.0, wall: float = 1_700_000_000.0) -> None:
        self.now = start
        self.wall_offset = wall - start
        self.sleeps: List[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + self.wall_offset

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


Handler = Callable[[httpx.Request], httpx.Response]


class Harness:
    """One transport (sync or async) around a MockTransport handler, with a fake clock; every
    request of the harness shares the transport, so its budget too."""

    def __init__(
        self,
        mode: str,
        handler: Handler,
        policy: Optional[oncely.RetryPolicy] = None,
        clock: Optional[FakeClock] = None,
        **kwargs: Any,
    ) -> None:
        self.mode = mode
        self.clock = clock or FakeClock()
        self.seen: List[httpx.Request] = []

        def recording(request: httpx.Request) -> httpx.Response:
            self.seen.append(request)
            return handler(request)

        mock = httpx.MockTransport(recording)
        self.transport: Any
        if mode == "sync":
            self.transport = oncely.RetryTransport(mock, policy, clock=self.clock, **kwargs)
        else:
            self.transport = oncely.AsyncRetryTransport(mock, policy, clock=self.clock, **kwargs)

    @property
    def keys(self) -> List[Optional[str]]:
        return [r.headers.get("idempotency-key") for r in self.seen]

    def request(self, method: str, url: str = "http://api.test/v1/payments", **kwargs: Any) -> httpx.Response:
        """Sends one logical call and reads the response body."""
        if self.mode == "sync":
            with httpx.Client(transport=self.transport) as client:
                response = client.request(method, url, **kwargs)
                response.read()
                return response

        async def run() -> httpx.Response:
            async with httpx.AsyncClient(transport=self.transport) as client:
                response = await client.request(method, url, **kwargs)
                await response.aread()
                return response

        return asyncio.run(run())


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def script(*responses: Any) -> Handler:
    """A handler that answers each attempt with the next item (a Response, or an exception to
    raise; a callable gets the request), repeating the last one."""
    items = list(responses)
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        i = min(calls["n"], len(items) - 1)
        calls["n"] += 1
        item = items[i]
        if callable(item) and not isinstance(item, httpx.Response):
            item = item(request)
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, httpx.Response)
        return item

    return handler


def problem(status: int, code: Optional[str] = None, retryable: Optional[bool] = None, **headers: str) -> Callable[[httpx.Request], httpx.Response]:
    """A problem+json response factory (a fresh Response per attempt)."""
    body: dict[str, Any] = {"type": "about:blank", "status": status}
    if code is not None:
        body["code"] = code
    if retryable is not None:
        body["retryable"] = retryable

    def make(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            status,
            json=body,
            headers={"content-type": "application/problem+json", **{k.replace("_", "-"): v for k, v in headers.items()}},
        )

    return make


def status(code: int, **headers: str) -> Callable[[httpx.Request], httpx.Response]:
    """A bare response factory (a fresh Response per attempt)."""

    def make(request: httpx.Request) -> httpx.Response:
        return httpx.Response(code, headers={k.replace("_", "-"): v for k, v in headers.items()})

    return make


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Prints the conformance counts (scenarios passed per transport) when the runner ran."""
    import sys

    module = sys.modules.get("test_conformance")
    if module is None:
        return
    results = getattr(module, "RESULTS")
    total = len(getattr(module, "ALL"))
    http = len(getattr(module, "HTTP"))
    line = (
        f"conformance: {total} scenarios; offline {results['offline'][0]} passed, "
        f"{results['offline'][1]} failed; http ({http}) sync {results['sync'][0]} passed, "
        f"{results['sync'][1]} failed; async {results['async'][0]} passed, {results['async'][1]} failed"
    )
    terminalreporter.write_line(line)
