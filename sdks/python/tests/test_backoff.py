"""Backoff bounds: doubling, saturation at the cap, and [0, cap] over many random draws."""

from __future__ import annotations

import random

import pytest

from oncely import Backoff


def test_ceiling_doubles_then_saturates_at_cap() -> None:
    b = Backoff.full_jitter(0.005, 2.0)
    assert b.ceiling(0) == 0.005
    assert b.ceiling(1) == 0.010
    assert b.ceiling(8) == pytest.approx(1.28)
    assert b.ceiling(9) == 2.0
    for retry in (31, 32, 63, 64, 65, 126, 127, 128, 1000, 1022, 1023, 1024, 2**32 - 1, 10**12):
        assert b.ceiling(retry) == 2.0, retry


def test_default_schedule_is_half_a_second_doubling_to_eight() -> None:
    b = Backoff()
    assert [b.ceiling(n) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_high_retry_numbers_never_raise_nor_wrap_to_zero() -> None:
    # A 10 ms cap at retry 64 overflowed elsewhere; retry 32 wrapped to a zero delay.
    b = Backoff.full_jitter(0.001, 0.010)
    rng = random.Random(6)
    for retry in (32, 33, 63, 64, 65, 2**31, 2**32 - 1, 2**64):
        assert b.ceiling(retry) == 0.010
        draws = [b.delay(retry, None, rng) for _ in range(200)]
        assert all(0.0 <= d <= 0.010 for d in draws)
        # Spread across [0, cap], not stuck at zero.
        assert max(draws) > 0.005


def test_negative_retry_and_bad_durations_are_refused() -> None:
    with pytest.raises(ValueError):
        Backoff().ceiling(-1)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            Backoff(base=bad)
        with pytest.raises(ValueError):
            Backoff(cap=bad)
    with pytest.raises(ValueError):
        Backoff(jitter="none")


def test_full_jitter_stays_within_zero_and_cap_for_random_configs() -> None:
    """Property: for every base, cap and retry number, 0 <= delay <= min(cap, base * 2**retry)."""
    rng = random.Random(2024)
    scales = (0.0, 1e-9, 1e-3, 0.5, 8.0, 3600.0, 1e12)
    for _ in range(20_000):
        base = rng.choice(scales) * rng.random()
        cap = rng.choice(scales) * rng.random()
        retry = rng.choice((rng.randrange(0, 200), rng.randrange(0, 2**32), 2**32 - 1))
        b = Backoff.full_jitter(base, cap)
        d = b.delay(retry, None, rng)
        assert 0.0 <= d <= b.ceiling(retry) <= cap
        if base > 0 and retry >= 1100:
            assert b.ceiling(retry) == cap


def test_decorrelated_jitter_stays_between_base_and_cap() -> None:
    rng = random.Random(1)
    b = Backoff.decorrelated_jitter(0.005, 0.100)
    previous = None
    for retry in range(1000):
        d = b.delay(retry, previous, rng)
        assert 0.005 <= d <= 0.100
        previous = d
    # Random configurations, previous delays included.
    for _ in range(20_000):
        base = rng.random() * rng.choice((1e-3, 1.0, 1e6))
        cap = rng.random() * rng.choice((1e-3, 1.0, 1e6))
        previous = rng.choice((None, 0.0, rng.random() * 1e9))
        b = Backoff.decorrelated_jitter(base, cap)
        d = b.delay(rng.randrange(0, 2**32), previous, rng)
        assert min(base, cap) <= d <= cap


def test_full_jitter_draws_cover_the_whole_range() -> None:
    """Over many draws the first retry's sleeps fill [0, 0.5 s]: some near each end, a mean
    near the middle (full jitter, not equal or no jitter)."""
    rng = random.Random(7)
    b = Backoff()
    draws = [b.delay(0, None, rng) for _ in range(5000)]
    assert min(draws) < 0.01
    assert max(draws) > 0.49
    assert max(draws) <= 0.5
    assert 0.23 < sum(draws) / len(draws) < 0.27
    second = [b.delay(1, None, rng) for _ in range(5000)]
    assert max(second) <= 1.0 and max(second) > 0.98
