"""The clock plug point: every "now" and every sleep of the retry loop goes through it.

The default, :class:`SystemClock`, is ``time.monotonic`` for the deadline, ``time.time`` for
turning a ``Retry-After`` date into a wait, and ``time.sleep`` / ``asyncio.sleep``. Tests can
plug a virtual clock whose sleeps only advance its own time, to check a 120-second
``Retry-After`` without waiting 120 seconds. All values are in seconds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """Monotonic time, wall-clock time and sleeping, in seconds."""

    def monotonic(self) -> float:
        """Monotonic now, used for the deadline."""
        ...

    def time(self) -> float:
        """Wall-clock now (seconds since the Unix epoch), used for ``Retry-After`` dates."""
        ...

    def sleep(self, seconds: float) -> None:
        """Blocks for ``seconds`` (the sync transport)."""
        ...

    async def asleep(self, seconds: float) -> None:
        """Waits ``seconds`` (the async transport); cancellable."""
        ...


class SystemClock:
    """The default clock: ``time.monotonic``, ``time.time``, ``time.sleep``, ``asyncio.sleep``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
