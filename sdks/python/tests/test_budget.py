"""The retry budget: the AWS standard-mode numbers, refunds, and no overdraw under threads."""

from __future__ import annotations

import threading

import pytest

from oncely import BudgetConfig, RetryBudget
from oncely.budget import THROTTLE, TRANSIENT


def test_drains_after_35_transient_retries_and_refills() -> None:
    b = RetryBudget()
    assert b.available == 500
    n = 0
    while b.try_withdraw(TRANSIENT) is not None:
        n += 1
    assert n == 35
    assert b.available == 10
    assert b.try_withdraw(TRANSIENT) is None
    assert b.available == 10
    # A throttle retry is cheaper and still fits in 10 tokens.
    assert b.try_withdraw(THROTTLE) == (5, 5)
    b.on_success(5)
    assert b.available == 10
    b.on_success(None)
    assert b.available == 11
    for _ in range(1000):
        b.on_success(None)
    assert b.available == 500


def test_config_numbers_and_validation() -> None:
    c = BudgetConfig()
    assert (c.capacity, c.transient_cost, c.throttle_cost, c.success_refund) == (500, 14, 5, 1)
    assert c.cost(TRANSIENT) == 14 and c.cost(THROTTLE) == 5
    small = RetryBudget(BudgetConfig(capacity=20))
    assert small.try_withdraw(TRANSIENT) == (6, 14)
    assert small.try_withdraw(TRANSIENT) is None
    with pytest.raises(ValueError):
        BudgetConfig(capacity=-1)
    with pytest.raises(ValueError):
        BudgetConfig(transient_cost=1.5)  # type: ignore[arg-type]


def test_concurrent_withdrawals_never_overdraw() -> None:
    b = RetryBudget()
    counts = []
    start = threading.Barrier(8)

    def worker() -> None:
        start.wait()
        n = 0
        for _ in range(100):
            if b.try_withdraw(TRANSIENT) is not None:
                n += 1
        counts.append(n)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == 35
    assert b.available == 10
