"""The httpx timeouts of one attempt: the caller's own, each cut to the attempt's time.

An attempt may take ``min(attempt timeout, time left of the deadline)`` seconds; its connect
timeout is also cut to the policy's connect timeout (3 s by default). httpx puts its timeouts on
the request (``request.extensions["timeout"]``: ``connect``, ``read``, ``write``, ``pool``, in
seconds, ``None`` for no limit) and bounds each network operation with them, so each attempt sets
there the smaller of the caller's value and its own limit.
"""

from __future__ import annotations

import math
from typing import Dict, Mapping, Optional

import httpx

__all__ = ["attempt_timeouts", "caller_timeouts", "cut", "seconds_or_none"]

#: httpx's own default timeouts (``httpx.Timeout(5.0)``), which every client without a
#: ``timeout=`` argument puts on each request.
_HTTPX_DEFAULT_TIMEOUTS = httpx.Timeout(5.0).as_dict()


def seconds_or_none(value: float) -> Optional[float]:
    """``value`` in seconds, or ``None`` (no limit) for an infinite one."""
    return None if math.isinf(value) else value


def caller_timeouts(value: object) -> Mapping[str, object]:
    """The timeouts of the request that cap each attempt: the caller's own. httpx's default
    (5 s for each of the four) is not a choice of the caller but what every client without a
    ``timeout=`` carries: it would cut the policy's attempt timeout (10 s) in half, so it is left
    out, and each attempt gets ``min(attempt timeout, time left)`` (``docs/CONTRACT.md``,
    "Retrying"). A caller who wants 5 s attempts says so with ``attempt_timeout=5.0``."""
    if not isinstance(value, Mapping) or dict(value) == _HTTPX_DEFAULT_TIMEOUTS:
        return {}
    return value


def cut(value: object, limit: float) -> Optional[float]:
    """The smaller of a caller's timeout ``value`` (seconds; anything else counts as none) and
    ``limit`` (seconds), as httpx takes it (``None``: no limit)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return seconds_or_none(min(float(value), limit))
    return seconds_or_none(limit)


def attempt_timeouts(
    base: Mapping[str, object], limit: float, connect: float
) -> Dict[str, Optional[float]]:
    """The four httpx timeouts of an attempt: each of the caller's ``base`` cut to ``limit``
    seconds, the connect timeout to ``connect`` seconds."""
    return {
        "connect": cut(base.get("connect"), connect),
        "read": cut(base.get("read"), limit),
        "write": cut(base.get("write"), limit),
        "pool": cut(base.get("pool"), limit),
    }
