"""Parsing the ``Retry-After`` response header (RFC 9110, section 10.2.3).

The header is either ``delay-seconds`` (a non-negative decimal integer of seconds) or an
``HTTP-date``. RFC 9110 section 5.6.7 requires recipients to accept all three date forms:

=====================  ==================================
form                   example
=====================  ==================================
IMF-fixdate            ``Sun, 06 Nov 1994 08:49:37 GMT``
obsolete RFC 850       ``Sunday, 06-Nov-94 08:49:37 GMT``
ANSI C ``asctime()``   ``Sun Nov  6 08:49:37 1994``
=====================  ==================================

A malformed value (a negative number, a fraction, garbage, a date whose weekday is wrong) is
ignored: the header then gives no hint and the retry waits the jittered backoff alone. A date
in the past is a hint of zero. The retry loop uses the hint as a lower bound on the jittered
backoff (see :mod:`oncely.schedule`).

>>> now = 784111717.0  # Sun, 06 Nov 1994 08:48:37 GMT, in seconds since the epoch
>>> parse_retry_after("120", now)
120.0
>>> parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now)
60.0
>>> parse_retry_after("-5", now) is None
True
"""

from __future__ import annotations

import calendar
from typing import Optional, Sequence

__all__ = ["parse_retry_after", "parse_http_date", "retry_after_from_values"]

# delay-seconds that do not fit in 64 bits saturate, as the Rust SDK's Duration does: such a
# hint never fits a deadline, which is what such a server means.
_MAX_SECONDS = float(2**64 - 1)

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_SHORT_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_LONG_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _digits(s: str) -> Optional[int]:
    if not s or not all("0" <= c <= "9" for c in s):
        return None
    return int(s)


def _imf_fixdate(s: str) -> Optional[tuple[int, int, int, int, int, int, int]]:
    # Sun, 06 Nov 1994 08:49:37 GMT
    if len(s) != 29 or s[25:] != " GMT" or s[16] != " " or s[19] != ":" or s[22] != ":":
        return None
    if s[3:5] != ", " or s[:3] not in _SHORT_DAYS:
        return None
    if s[7] != " " or s[11] != " " or s[8:11] not in _MONTHS:
        return None
    fields = (_digits(s[12:16]), _digits(s[5:7]), _digits(s[17:19]), _digits(s[20:22]), _digits(s[23:25]))
    if any(f is None for f in fields):
        return None
    year, day, hour, minute, sec = (f for f in fields if f is not None)
    return year, _MONTHS.index(s[8:11]) + 1, day, hour, minute, sec, _SHORT_DAYS.index(s[:3])


def _rfc850(s: str) -> Optional[tuple[int, int, int, int, int, int, int]]:
    # Sunday, 06-Nov-94 08:49:37 GMT
    comma = s.find(", ")
    if comma < 0 or s[:comma] not in _LONG_DAYS:
        return None
    wday = _LONG_DAYS.index(s[:comma])
    rest = s[comma + 2 :]
    if len(rest) != 22 or rest[12] != ":" or rest[15] != ":" or rest[18:] != " GMT":
        return None
    if rest[2] != "-" or rest[6] != "-" or rest[9] != " " or rest[3:6] not in _MONTHS:
        return None
    fields = (_digits(rest[7:9]), _digits(rest[0:2]), _digits(rest[10:12]), _digits(rest[13:15]), _digits(rest[16:18]))
    if any(f is None for f in fields):
        return None
    yy, day, hour, minute, sec = (f for f in fields if f is not None)
    # Two-digit years: 70-99 are 1970-1999, 00-69 are 2000-2069 (as the Rust SDK reads them).
    year = yy + (2000 if yy < 70 else 1900)
    return year, _MONTHS.index(rest[3:6]) + 1, day, hour, minute, sec, wday


def _asctime(s: str) -> Optional[tuple[int, int, int, int, int, int, int]]:
    # Sun Nov  6 08:49:37 1994
    if len(s) != 24 or s[10] != " " or s[13] != ":" or s[16] != ":" or s[19] != " ":
        return None
    if s[3] != " " or s[:3] not in _SHORT_DAYS or s[7] != " " or s[4:7] not in _MONTHS:
        return None
    day = _digits(s[9]) if s[8] == " " else _digits(s[8:10])
    fields = (_digits(s[20:24]), day, _digits(s[11:13]), _digits(s[14:16]), _digits(s[17:19]))
    if any(f is None for f in fields):
        return None
    year, d, hour, minute, sec = (f for f in fields if f is not None)
    return year, _MONTHS.index(s[4:7]) + 1, d, hour, minute, sec, _SHORT_DAYS.index(s[:3])


def parse_http_date(value: str) -> Optional[float]:
    """Parses an HTTP-date in any of its three forms into seconds since the Unix epoch.

    Returns ``None`` for anything else, including a date outside the years 1970 to 9999, an
    impossible date (30 February) or a weekday that does not match the date.
    """
    s = value.strip()
    if not s.isascii():
        return None
    parsed = _imf_fixdate(s) or _rfc850(s) or _asctime(s)
    if parsed is None:
        return None
    year, month, day, hour, minute, sec, wday = parsed
    if not (1970 <= year <= 9999 and hour < 24 and minute < 60 and sec < 60 and day >= 1):
        return None
    if day > calendar.monthrange(year, month)[1]:
        return None
    if calendar.weekday(year, month, day) != wday:
        return None
    return float(calendar.timegm((year, month, day, hour, minute, sec, 0, 0, 0)))


def parse_retry_after(value: str, now: float) -> Optional[float]:
    """Parses one ``Retry-After`` value into a wait in seconds, measured from ``now`` (wall
    clock, seconds since the Unix epoch).

    Returns ``None`` for a malformed or negative value. ``delay-seconds`` too large to
    represent saturates at 2**64 - 1 seconds. An HTTP-date in the past gives ``0.0``.
    """
    v = value.strip()
    if not v:
        return None
    if v.isascii() and v.isdigit():
        return min(float(int(v)), _MAX_SECONDS)
    when = parse_http_date(v)
    if when is None:
        return None
    return max(when - now, 0.0)


def retry_after_from_values(values: Sequence[str], now: float) -> Optional[float]:
    """The hint of a response's ``Retry-After`` header lines: ``None`` when there is none, when
    the header is repeated, or when its value is malformed."""
    if len(values) != 1:
        return None
    return parse_retry_after(values[0], now)
