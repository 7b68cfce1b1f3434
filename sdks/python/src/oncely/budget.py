"""The retry budget: a token bucket shared by every request of one transport.

"At most 3 attempts" bounds what *one* call can do, but says nothing about what a *fleet* does.
When a dependency goes down every request fails and every one retries: with 3 attempts an
outage turns 1,000 requests a second into 3,000, arriving when the dependency is least able to
serve them. A budget sees all the calls of a client: each retry spends tokens from one bucket,
successes put tokens back. While most requests succeed the bucket stays full and an unlucky
request is retried as usual; when most fail, nothing refills it, it drains after a bounded
number of retries, and from then on failures are returned at once. When the dependency
recovers, successes refill the bucket and retries resume on their own, with no restart.

The numbers follow the AWS SDKs' standard retry mode (AWS SDKs and Tools Reference Guide,
"Retry behavior"), the same as the Rust SDK ``oncely-client``: a bucket of **500** tokens; a
retry after a transient error (a 5xx, a timeout, a reset or failed connection) costs **14**; a
retry after throttling (429, or the server's ``idempotency_request_in_flight``) costs **5**; a
call that succeeds on its first attempt refunds **1**; a call that succeeds after a retry
refunds the cost of that retry. Under a total outage a full bucket pays for ``500 // 14 = 35``
transient retries, then none, whatever the number of calls.

>>> budget = RetryBudget()
>>> retries = 0
>>> while budget.try_withdraw(TRANSIENT) is not None:
...     retries += 1
>>> retries
35
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional, Tuple

__all__ = ["BudgetConfig", "RetryBudget", "TRANSIENT", "THROTTLE"]

#: A 5xx, a timeout, a failed or reset connection (default price 14 tokens).
TRANSIENT = "transient"
#: A 429 or an ``idempotency_request_in_flight`` 409: the server asks to come back later
#: (default price 5 tokens).
THROTTLE = "throttle"


@dataclass(frozen=True)
class BudgetConfig:
    """The numbers of a :class:`RetryBudget`, all in tokens.

    Defaults (AWS SDKs' standard retry mode): capacity 500, transient retry 14, throttle retry
    5, first-attempt success refund 1. Raises ``ValueError`` for a negative number.
    """

    capacity: int = 500
    """Capacity of the bucket, and its initial fill."""
    transient_cost: int = 14
    """What a retry after a transient error costs."""
    throttle_cost: int = 5
    """What a retry after throttling costs."""
    success_refund: int = 1
    """What a call that succeeds on its first attempt refunds."""

    def __post_init__(self) -> None:
        for name in ("capacity", "transient_cost", "throttle_cost", "success_refund"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative whole number of tokens")

    def cost(self, kind: str) -> int:
        """The price of one retry of this kind (:data:`TRANSIENT` or :data:`THROTTLE`)."""
        return self.throttle_cost if kind == THROTTLE else self.transient_cost


class RetryBudget:
    """A token bucket shared by every request of one transport (or several, if handed to them).

    Thread-safe: the balance is guarded by a lock, so concurrent calls never overdraw it.
    """

    def __init__(self, config: Optional[BudgetConfig] = None) -> None:
        self._config = config or BudgetConfig()
        self._tokens = self._config.capacity
        self._lock = threading.Lock()

    @property
    def config(self) -> BudgetConfig:
        """The configuration."""
        return self._config

    @property
    def available(self) -> int:
        """Tokens currently in the bucket."""
        with self._lock:
            return self._tokens

    def try_withdraw(self, kind: str) -> Optional[Tuple[int, int]]:
        """Pays for one retry of this kind; returns ``(tokens_left, cost)``, or ``None`` (and
        takes nothing) when the bucket holds fewer tokens than the retry costs."""
        cost = self._config.cost(kind)
        with self._lock:
            if self._tokens < cost:
                return None
            self._tokens -= cost
            return self._tokens, cost

    def on_success(self, last_retry_cost: Optional[int]) -> None:
        """Records a successful logical call: refunds the price of its last retry when it was
        retried (``last_retry_cost``), else the first-attempt refund. Never above capacity."""
        self.deposit(self._config.success_refund if last_retry_cost is None else last_retry_cost)

    def deposit(self, tokens: int) -> None:
        """Adds tokens, never above capacity."""
        with self._lock:
            self._tokens = min(self._config.capacity, self._tokens + max(tokens, 0))

    def __repr__(self) -> str:
        return f"RetryBudget(available={self.available}, config={self._config!r})"
