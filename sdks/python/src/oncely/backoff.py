"""Backoff with jitter: how long to sleep before the next attempt.

Two strategies, both from Marc Brooker's AWS Architecture Blog post "Exponential Backoff And
Jitter" (2015):

- **Full jitter** (the default): ``sleep = random(0, min(cap, base * 2**retry))``. In the post's
  simulation it does the least total work of every strategy, which is what matters when many
  clients contend for one resource.
- **Decorrelated jitter**: ``sleep = min(cap, random(base, previous_sleep * 3))``. It finishes
  slightly sooner at the price of a little more work; pick it for latency-bound callers.

No un-jittered option is offered: a fleet of clients that failed together and back off by the
same amount fails together again.

For every retry number (however large) and every configuration the delay is within
``[0, cap]``: the exponential ceiling saturates at ``cap``, so a high retry number never raises
and never wraps to a zero delay.

All durations are in seconds (``float``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional

__all__ = ["Backoff", "DEFAULT_BASE_DELAY", "DEFAULT_MAX_DELAY", "FULL", "DECORRELATED"]

#: Default base delay: 0.5 seconds (500 milliseconds).
DEFAULT_BASE_DELAY = 0.5
#: Default cap on one delay: 8 seconds.
DEFAULT_MAX_DELAY = 8.0

#: ``random(0, min(cap, base * 2**retry))``: least total work under contention (the default).
FULL = "full"
#: ``min(cap, random(base, previous * 3))``: slightly faster completion, slightly more work.
DECORRELATED = "decorrelated"

# 2.0 ** 1024 overflows a float; any retry number at or past this saturates at the cap.
_MAX_EXPONENT = 1023


def _check_duration(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite, non-negative number of seconds, got {value!r}")


@dataclass(frozen=True)
class Backoff:
    """A jittered exponential backoff: base delay and cap in seconds, and a jitter formula.

    ``retry`` in :meth:`delay` and :meth:`ceiling` counts *retries* from 0: the sleep before the
    first retry uses ``retry=0``, so its ceiling is ``base``.

    Defaults: full jitter, base 0.5 s, cap 8 s (see :mod:`oncely.policy` for why).

    Raises ``ValueError`` for a negative, infinite or NaN duration and for an unknown jitter name.
    """

    base: float = DEFAULT_BASE_DELAY
    """The base delay, in seconds (default 0.5)."""
    cap: float = DEFAULT_MAX_DELAY
    """The largest delay ever returned, in seconds (default 8)."""
    jitter: str = FULL
    """``"full"`` (default) or ``"decorrelated"``."""

    def __post_init__(self) -> None:
        _check_duration("base", self.base)
        _check_duration("cap", self.cap)
        if self.jitter not in (FULL, DECORRELATED):
            raise ValueError(f"jitter must be 'full' or 'decorrelated', got {self.jitter!r}")

    @classmethod
    def full_jitter(cls, base: float, cap: float) -> Backoff:
        """Full jitter with this base delay and cap, in seconds."""
        return cls(base=base, cap=cap, jitter=FULL)

    @classmethod
    def decorrelated_jitter(cls, base: float, cap: float) -> Backoff:
        """Decorrelated jitter with this base delay and cap, in seconds."""
        return cls(base=base, cap=cap, jitter=DECORRELATED)

    def ceiling(self, retry: int) -> float:
        """The un-jittered exponential ceiling ``min(cap, base * 2**retry)``, in seconds.

        Saturates at ``cap`` for every high ``retry`` (a float overflow means "larger than any
        cap"); never raises for a non-negative ``retry``, never returns a wrapped zero.
        Raises ``ValueError`` for a negative ``retry``.
        """
        if retry < 0:
            raise ValueError(f"retry counts from 0, got {retry}")
        if self.base == 0:
            return 0.0
        if retry >= _MAX_EXPONENT:
            return float(self.cap)
        scaled = self.base * (2.0**retry)
        return float(min(self.cap, scaled))

    def delay(
        self,
        retry: int,
        previous: Optional[float] = None,
        rng: Optional[random.Random] = None,
    ) -> float:
        """The jittered delay before retry number ``retry`` (counted from 0), in seconds.

        ``previous`` is the delay drawn before the previous retry of the same logical call, if
        any; only decorrelated jitter uses it (it starts from ``base``). ``rng`` is the random
        source (default: the ``random`` module's). The result is always within ``[0, cap]``.
        """
        draw = (rng or _DEFAULT_RNG).uniform
        if self.jitter == FULL:
            ceiling = self.ceiling(retry)
            return min(max(draw(0.0, ceiling), 0.0), ceiling)
        low = min(self.base, self.cap)
        prev = self.base if previous is None else previous
        high = max(min(prev * 3.0, self.cap), low)
        if high <= low:
            return float(low)
        return float(min(max(draw(low, high), low), self.cap))


_DEFAULT_RNG = random.Random()
