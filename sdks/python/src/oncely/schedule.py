"""The transport-agnostic core of the retry loop: after a retryable outcome, decide whether to
retry and how long to wait, or why to stop.

:class:`CallState` is one logical call; :meth:`CallState.plan_retry` checks, in this order (the
same as the Rust SDK ``oncely-client``):

1. the attempt limit (``attempts_exhausted``), which counts every attempt except those answered
   ``409 idempotency_request_in_flight``: the server ran nothing for them, so the call keeps
   waiting for the first request's answer until the deadline, each conflict's ``Retry-After`` a
   lower bound on its wait (``docs/DESIGN.md``, "In-use answer treated as failure");
2. the deadline: no time left (``deadline_exhausted``);
3. the jittered backoff, combined with the server's ``Retry-After`` as a lower bound:
   ``wait = max(hint, jittered)`` (RFC 9110 section 10.2.3 says how long to wait *at least*,
   so ``Retry-After: 0`` still waits the jittered backoff);
4. a hint that does not fit in the time left ends the call at once, carrying the hint
   (``retry_after_beyond_deadline``); a wait that does not fit ends it with
   ``deadline_exhausted``: no sleep ever ends past the deadline;
5. the retry budget pays for the retry, or the call stops (``budget_empty``).

The deadline starts with the logical call and is never reset; each attempt's timeout is the
smaller of its own limit and the time left. All durations are in seconds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from .budget import RetryBudget
from .classify import RetryReason
from .policy import RetryPolicy

__all__ = ["BACKOFF", "CallState", "RETRY_AFTER", "RetryPlan", "Stop", "combine_wait"]

#: The wait was set by the jittered backoff (no hint, or a hint no longer than it).
BACKOFF = "backoff"
#: The wait was set by the server's ``Retry-After``, longer than the jittered backoff.
RETRY_AFTER = "retry-after"


@dataclass(frozen=True)
class RetryPlan:
    """A decided retry."""

    wait: float
    """Seconds to sleep before the next attempt."""
    source: str
    """What set that length: :data:`BACKOFF` or :data:`RETRY_AFTER`."""
    backoff: float
    """The jittered backoff that was drawn, in seconds."""
    hint: Optional[float]
    """The server's ``Retry-After`` in seconds, if it sent a well-formed one."""
    tokens_left: Optional[int]
    """Tokens left in the budget after paying, if a budget is in use."""
    cost: Optional[int]
    """Tokens this retry cost, if a budget is in use."""
    retry_number: int
    """Which retry this is (1 for the second attempt)."""


class Stop(Exception):
    """Why a call must stop instead of retrying (internal: the transport turns it into the
    matching :class:`~oncely.RetryError`). ``kind`` is the error's ``reason``."""

    def __init__(self, kind: str, message: str, **fields: float) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.fields = fields


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def deadline_exhausted(deadline: float) -> Stop:
    """The overall deadline of ``deadline`` seconds ran out."""
    return Stop("deadline_exhausted", f"overall deadline of {_ms(deadline)} ms exhausted")


def combine_wait(hint: Optional[float], jittered: float) -> tuple[float, str]:
    """``max(hint, jittered)`` and which of the two it was; a hint equal to the backoff counts
    as the backoff."""
    if hint is not None and hint > jittered:
        return hint, RETRY_AFTER
    return jittered, BACKOFF


class CallState:
    """The state of one logical call: its deadline (``start`` and ``total`` in seconds of a
    monotonic clock), the attempts made, the previous delay and the last retry's cost."""

    def __init__(self, start: float, total: float) -> None:
        self.start = start
        self.total = total
        self.attempts = 0
        self.in_flight_answers = 0
        self.previous_delay: Optional[float] = None
        self.last_retry_cost: Optional[int] = None

    def elapsed(self, now: float) -> float:
        """Seconds spent since the start, as of ``now``."""
        return max(now - self.start, 0.0)

    def remaining(self, now: float) -> float:
        """Seconds left as of ``now`` (zero once the deadline has passed)."""
        return max(self.total - self.elapsed(now), 0.0)

    def attempt_limit(self, now: float, limit: float) -> float:
        """The timeout of an attempt starting at ``now``: ``min(limit, remaining)``."""
        return min(limit, self.remaining(now))

    @property
    def counted_attempts(self) -> int:
        """Attempts that count against ``max_attempts``: all but those answered in flight."""
        return max(self.attempts - self.in_flight_answers, 0)

    def record_attempt(self) -> None:
        """Records that an attempt is being made."""
        self.attempts += 1

    def on_success(self, budget: Optional[RetryBudget]) -> None:
        """Records a successful end in the budget: refunds the last retry's cost, or the
        first-attempt refund."""
        if budget is not None:
            budget.on_success(self.last_retry_cost)

    def plan_retry(
        self,
        policy: RetryPolicy,
        budget: Optional[RetryBudget],
        reason: RetryReason,
        hint: Optional[float],
        now: float,
        rng: random.Random,
    ) -> RetryPlan:
        """Decides the retry after a retryable outcome observed at ``now`` (see the module docs
        for the order of the checks). Raises :class:`Stop` when the call must stop instead;
        nothing is withdrawn from the budget then."""
        # The server ran nothing for an in-flight answer: the wait for the first request's
        # answer is bounded by the deadline, not by the attempt limit (docs/DESIGN.md,
        # "In-use answer treated as failure").
        if reason.kind == "in_flight":
            self.in_flight_answers += 1
        if self.counted_attempts >= policy.max_attempts:
            raise Stop(
                "attempts_exhausted",
                f"all {policy.max_attempts} attempts failed",
                max_attempts=policy.max_attempts,
            )
        remaining = self.remaining(now)
        if remaining <= 0:
            raise deadline_exhausted(self.total)
        retry_index = max(self.attempts - 1, 0)
        jittered = policy.backoff.delay(retry_index, self.previous_delay, rng)
        wait, source = combine_wait(hint, jittered)
        if hint is not None and hint >= remaining:
            raise Stop(
                "retry_after_beyond_deadline",
                f"server asked to retry after {_ms(hint)} ms but only {_ms(remaining)} ms of "
                "the deadline were left",
                hint=hint,
                remaining=remaining,
            )
        if not wait < remaining:
            raise deadline_exhausted(self.total)
        tokens_left: Optional[int] = None
        cost: Optional[int] = None
        if budget is not None:
            paid = budget.try_withdraw(reason.cost)
            if paid is None:
                price = budget.config.cost(reason.cost)
                available = budget.available
                raise Stop(
                    "budget_empty",
                    f"retry budget empty ({available} tokens left, a retry costs {price})",
                    available=available,
                    cost=price,
                )
            tokens_left, cost = paid
        self.previous_delay = jittered
        self.last_retry_cost = cost
        return RetryPlan(
            wait=wait,
            source=source,
            backoff=jittered,
            hint=hint,
            tokens_left=tokens_left,
            cost=cost,
            retry_number=self.attempts,
        )
