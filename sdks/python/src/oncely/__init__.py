"""Oncely for Python: safe retries for httpx.

``httpx.Client(transport=oncely.RetryTransport())`` is the whole setup. The transport retries
an explicit allowlist (connection failures before sending, 408, 429, 502, 503, 504, the
server's ``idempotency_request_in_flight``; timeouts and resets after sending only for requests
safe to repeat), mints one ``Idempotency-Key`` per logical ``POST``/``PATCH`` call and reuses it
on every attempt, sleeps a full-jitter backoff that never undercuts ``Retry-After``, keeps one
overall deadline, and spends a retry budget shared by every call. It is the Rust SDK
``oncely-client``'s behaviour, default for default, and both are held to one conformance file.

What it promises with a server that honours ``Idempotency-Key`` is *effectively-once*:
at-least-once delivery plus duplicate collapse on the server. It does not promise exactly-once
execution, which no client can: a request that timed out may have run, and only the key lets
a retry find out without running it twice.
"""

from __future__ import annotations

import logging

from .backoff import Backoff
from .budget import BudgetConfig, RetryBudget
from .classify import Problem, ResponseFacts
from .clock import Clock, SystemClock
from .errors import (
    AttemptsExhausted,
    BodyNotReplayable,
    BudgetExhausted,
    DeadlineExhausted,
    InvalidIdempotencyKey,
    NestedRetryLayer,
    NotRetryable,
    OutcomeUnknown,
    RetryAfterBeyondDeadline,
    RetryError,
)
from .key import is_valid_key
from .metrics import RetryMetrics
from .policy import CallOptions, RetryPolicy
from .transport import AsyncRetryTransport, RetryTransport

# A library adds no handler but this one (the logging HOWTO, "Configuring Logging for a
# Library"): the application decides where the ``oncely`` logger's records go.
logging.getLogger("oncely").addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "AsyncRetryTransport",
    "AttemptsExhausted",
    "Backoff",
    "BodyNotReplayable",
    "BudgetConfig",
    "BudgetExhausted",
    "CallOptions",
    "Clock",
    "DeadlineExhausted",
    "InvalidIdempotencyKey",
    "NestedRetryLayer",
    "NotRetryable",
    "OutcomeUnknown",
    "Problem",
    "ResponseFacts",
    "RetryAfterBeyondDeadline",
    "RetryBudget",
    "RetryError",
    "RetryMetrics",
    "RetryPolicy",
    "RetryTransport",
    "SystemClock",
    "is_valid_key",
]
