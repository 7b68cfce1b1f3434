"""Retry-After: delta-seconds, the three HTTP-date forms, and what is ignored."""

from __future__ import annotations

import pytest

from oncely.retry_after import parse_http_date, parse_retry_after, retry_after_from_values

# Sun, 06 Nov 1994 08:47:37 GMT
NOW = 784111657.0


def test_delay_seconds() -> None:
    assert parse_retry_after("0", NOW) == 0.0
    assert parse_retry_after(" 7 ", NOW) == 7.0
    assert parse_retry_after("120", NOW) == 120.0
    # Too large to represent: saturates (it fits no deadline), never ignored.
    assert parse_retry_after("99999999999999999999999", NOW) == float(2**64 - 1)


def test_all_three_date_forms() -> None:
    for value in (
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994",
    ):
        assert parse_retry_after(value, NOW) == 120.0, value
    assert parse_http_date("Sun Nov 06 08:49:37 1994") == NOW + 120


def test_past_date_is_zero() -> None:
    assert parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", NOW) == 0.0
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", NOW) == 0.0


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "   ",
        "-1",
        "-120",
        "1.5",
        "soon",
        "12s",
        "+5",
        "١٢",  # Arabic-Indic digits are not delay-seconds
        "Sun, 32 Nov 1994 08:49:37 GMT",
        "Mon, 06 Nov 1994 08:49:37 GMT",  # wrong weekday
        "Sun, 06 Nov 1994 24:00:00 GMT",
        "Sun, 06 Nov 1994 08:49:37 UTC",
        "Sun, 06 Nov 1994 08:49:37",
        "Wed, 30 Feb 2028 08:49:37 GMT",
        "Sun, 06 Nov 1969 08:49:37 GMT",
        "Sun, 6 Nov 1994 08:49:37 GMT",
        "Sun 06 Nov 1994 08:49:37 GMT",
        "sun, 06 nov 1994 08:49:37 gmt",
        "Sunday, 06-Nov-1994 08:49:37 GMT",
    ],
)
def test_malformed_or_negative_is_ignored(bad: str) -> None:
    assert parse_retry_after(bad, NOW) is None


def test_two_digit_years_and_leap_days() -> None:
    # 00-69 are 2000-2069; 70-99 are 1970-1999 (as the Rust SDK reads them).
    assert parse_http_date("Thursday, 01-Jan-70 00:00:00 GMT") == 0.0
    assert parse_http_date("Saturday, 01-Jan-00 00:00:00 GMT") == 946684800.0
    assert parse_http_date("Thu, 29 Feb 2024 00:00:00 GMT") == 1709164800.0
    assert parse_http_date("Fri, 29 Feb 2023 00:00:00 GMT") is None


def test_header_values() -> None:
    assert retry_after_from_values([], NOW) is None
    assert retry_after_from_values(["3"], NOW) == 3.0
    # Repeated: ambiguous, ignored.
    assert retry_after_from_values(["3", "4"], NOW) is None
