"""The retry policy: how many attempts, how long in total, how long each, how to back off.

These defaults are the contract for callers who never read docs; they are the Rust SDK
``oncely-client``'s, default for default, and justified against three SDK families:

=====================  ==========  ==================  =================  ================
setting                Oncely      AWS SDKs (standard)  Stripe             Stainless SDKs
=====================  ==========  ==================  =================  ================
attempts in total      **3**       3                   1 + 2 retries      1 + 2 retries
base delay             **0.5 s**   1 s                 0.5 s              0.5 s
cap on one delay       **8 s**     20 s                5 s                8 s
per-attempt timeout    **10 s**    per service         80 s               60 s
connect timeout        **3 s**     3.1 s               not compared       not compared
overall deadline       **30 s**    none                none               none
jitter                 **full**    full                partial            partial
=====================  ==========  ==================  =================  ================

- **3 attempts**: what all three families converge on; more multiply load during an outage
  (see :mod:`oncely.budget`) and rarely turn a failure into a success.
- **0.5 s base, 8 s cap**: with full jitter the expected sleeps before retries 1 and 2 are
  0.25 s and 0.5 s: quick for interactive callers, spread enough to de-synchronise a fleet.
- **30 s overall deadline**: the SDKs above bound each attempt but not the call; a caller that
  configured nothing gets an answer, a response or a typed error, within half a minute, while
  its own caller (often behind a 60 s load-balancer idle timeout) is still listening.
- **10 s per attempt**: leaves room inside the 30 s for the third attempt even when the first
  two hang, and is far above the latency of a healthy API write.
- **3 s to connect**: a handshake to a healthy server takes milliseconds; a connect that fails
  or times out sent nothing, so it is retried for any method, keyless ``POST`` included.
- **500 not retried**: usually a bug that will happen again, and on a write without a key it
  may have run; enable it with ``retry_500=True`` (then retried only when safe to repeat).

All durations are in seconds (``float``).

>>> policy = RetryPolicy(max_attempts=4, deadline=10.0, attempt_timeout=2.0)
>>> policy.max_attempts, RetryPolicy().deadline
(4, 30.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Union

from .backoff import Backoff
from .budget import BudgetConfig

__all__ = [
    "CallOptions",
    "DEFAULT_ATTEMPT_TIMEOUT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_DEADLINE",
    "DEFAULT_MAX_ATTEMPTS",
    "EXTENSION",
    "RetryPolicy",
]

#: Default total attempts per logical call (the first one included): 3.
DEFAULT_MAX_ATTEMPTS = 3
#: Default overall deadline per logical call: 30 seconds.
DEFAULT_DEADLINE = 30.0
#: Default per-attempt timeout: 10 seconds (always cut to the time left).
DEFAULT_ATTEMPT_TIMEOUT = 10.0
#: Default connect timeout: 3 seconds (never more than the attempt timeout).
DEFAULT_CONNECT_TIMEOUT = 3.0

#: The ``request.extensions`` key of per-call options (a :class:`CallOptions` or a dict).
EXTENSION = "oncely"


def _seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number of seconds, got {value!r}")
    if name == "attempt_timeout" and value == 0:
        # An attempt that may take no time is never sent: every call would end at once with
        # deadline_exhausted, which reads like an outage rather than a policy typo.
        raise ValueError("attempt_timeout must be more than 0 seconds")
    return float(value)


def _attempts(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_attempts must be a whole number, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"max_attempts must not be negative, got {value}")
    # As the Rust SDK: 0 means 1 (one attempt, no retry).
    return max(value, 1)


@dataclass(frozen=True)
class RetryPolicy:
    """How a transport retries. Immutable; change a field with :meth:`replace`.

    Defaults: 3 attempts, a 30 s deadline, 10 s per attempt and 3 s to connect, full jitter
    from 0.5 s capped at 8 s, 500 not retried, keys minted for ``POST`` and ``PATCH``, the
    default retry budget (:class:`~oncely.budget.BudgetConfig`; ``budget=None`` disables it,
    not recommended). Raises ``ValueError`` or ``TypeError`` for a value out of range.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    """Total attempts per logical call, the first included (0 or 1: no retry)."""
    deadline: float = DEFAULT_DEADLINE
    """The overall deadline of one logical call, all attempts and sleeps included, in seconds."""
    attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT
    """The timeout of one attempt, in seconds; each attempt gets ``min(this, time left)``."""
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    """The connect timeout, in seconds, cut to the attempt timeout and the time left. A
    connect that fails or times out sent nothing and is retried for any method."""
    backoff: Backoff = field(default_factory=Backoff)
    """The backoff (base, cap, jitter formula)."""
    retry_500: bool = False
    """Whether ``500 Internal Server Error`` is retried (only for requests safe to repeat)."""
    mint_keys: bool = True
    """Whether a ``POST`` or ``PATCH`` without an ``Idempotency-Key`` gets one minted (once per
    logical call). Off, ambiguous failures of such requests end as "outcome unknown"."""
    budget: Optional[BudgetConfig] = field(default_factory=BudgetConfig)
    """The retry budget's numbers, or ``None`` to disable the budget."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_attempts", _attempts(self.max_attempts))
        for name in ("deadline", "attempt_timeout", "connect_timeout"):
            object.__setattr__(self, name, _seconds(name, getattr(self, name)))
        if not isinstance(self.backoff, Backoff):
            raise TypeError("backoff must be an oncely.Backoff")
        if self.budget is not None and not isinstance(self.budget, BudgetConfig):
            raise TypeError("budget must be an oncely.BudgetConfig or None")

    def replace(self, **changes: Any) -> RetryPolicy:
        """A copy with these fields changed (``policy.replace(deadline=5.0)``)."""
        return replace(self, **changes)

    @property
    def effective_connect_timeout(self) -> float:
        """The connect timeout, cut to the attempt timeout, in seconds."""
        return min(self.connect_timeout, self.attempt_timeout)


@dataclass(frozen=True)
class CallOptions:
    """Per-call overrides, passed as ``request.extensions["oncely"]`` (a dict with the same
    keys works too)::

        client.post(url, json=body, extensions={"oncely": oncely.CallOptions(
            deadline=5.0, idempotency_key=f"order-confirm-{order_id}")})

    Unset fields (``None``) keep the transport's policy.
    """

    deadline: Optional[float] = None
    """This call's overall deadline in seconds, instead of the policy's."""
    max_attempts: Optional[int] = None
    """This call's total attempts instead of the policy's (1 disables retries for it)."""
    idempotency_key: Optional[str] = None
    """This call's ``Idempotency-Key`` (set as the header; an event-derived key is best). A
    request that already has a different one is refused before sending."""
    mint_key: Optional[bool] = None
    """Whether a ``POST`` or ``PATCH`` without a key gets one minted, instead of the policy's."""
    attempt_timeout: Optional[float] = None
    """This call's per-attempt timeout in seconds, instead of the policy's."""

    def __post_init__(self) -> None:
        if self.deadline is not None:
            object.__setattr__(self, "deadline", _seconds("deadline", self.deadline))
        if self.attempt_timeout is not None:
            object.__setattr__(
                self, "attempt_timeout", _seconds("attempt_timeout", self.attempt_timeout)
            )
        if self.max_attempts is not None:
            object.__setattr__(self, "max_attempts", _attempts(self.max_attempts))
        if self.idempotency_key is not None and not isinstance(self.idempotency_key, str):
            raise TypeError("idempotency_key must be a str")
        if self.mint_key is not None and not isinstance(self.mint_key, bool):
            raise TypeError("mint_key must be a bool")

    @classmethod
    def from_extension(cls, value: Union[CallOptions, Mapping[str, Any], None]) -> CallOptions:
        """Reads ``request.extensions["oncely"]``: a :class:`CallOptions`, a dict of its fields,
        or nothing. Raises ``TypeError`` for anything else or an unknown field."""
        if value is None:
            return cls()
        if isinstance(value, CallOptions):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise TypeError(f"unknown oncely call options: {sorted(unknown)}")
            return cls(**value)
        raise TypeError(
            f'request.extensions["{EXTENSION}"] must be an oncely.CallOptions or a dict, '
            f"not {type(value).__name__}"
        )

    def apply(self, policy: RetryPolicy) -> RetryPolicy:
        """``policy`` with these overrides."""
        changes: dict[str, Any] = {}
        if self.deadline is not None:
            changes["deadline"] = self.deadline
        if self.max_attempts is not None:
            changes["max_attempts"] = self.max_attempts
        if self.mint_key is not None:
            changes["mint_keys"] = self.mint_key
        if self.attempt_timeout is not None:
            changes["attempt_timeout"] = self.attempt_timeout
        return replace(policy, **changes) if changes else policy
