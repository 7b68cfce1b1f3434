"""Idempotency keys: minted once per logical call, reused on every attempt.

The ``Idempotency-Key`` request header (IETF HTTPAPI draft "The Idempotency-Key HTTP Header
Field") lets a server recognise a retried ``POST`` or ``PATCH`` and run its side effects once.
It only works if every attempt of one logical operation carries **the same** key.

Which key to use, best first:

1. **Event-derived**: built from the business event the call performs, such as
   ``order-confirm-{order_id}``. Every path that performs the same event (a process restart, a
   queue redelivery, a double click) sends the same key. Recommended.
2. **Request-scoped**: minted once when your own inbound request or job starts and passed down.
3. **Random, reused**: what the transport does when you set nothing: a UUID v4 minted once per
   logical call (one ``client.send``), reused on every attempt of that call.

Never mint a fresh key per attempt: the server then sees each retry as a new request, and a
retried payment is charged twice.

Keys follow the server's rules: 1 to 255 visible ASCII characters (``!`` to ``~``), the header
sent once; the draft's structured-field string form (``"abc"``) is accepted and unquoted, as the
server accepts it. A caller's key that breaks them ends the call with
:class:`oncely.InvalidIdempotencyKey` before anything is sent.
"""

from __future__ import annotations

import uuid
from typing import Sequence

__all__ = [
    "IDEMPOTENCY_KEY",
    "MAX_KEY_LEN",
    "KeyRuleError",
    "check_key",
    "has_surrounding_whitespace",
    "is_valid_key",
    "needs_key",
    "uuid4_key",
]

#: The header name (HTTP header names are case-insensitive).
IDEMPOTENCY_KEY = "Idempotency-Key"
#: The largest accepted key, in characters (keys are ASCII, so bytes too).
MAX_KEY_LEN = 255


class KeyRuleError(ValueError):
    """Why a key breaks the server's rules; its message is the server's (for example
    ``the Idempotency-Key header is empty``)."""


def _trim_ows(raw: bytes) -> bytes:
    return raw.strip(b" \t")


def _unquote(raw: bytes) -> bytes:
    # RFC 8941 section 4.2.5: a String is DQUOTE *( chr / "\" ( DQUOTE / "\" ) ) DQUOTE.
    if len(raw) < 2 or not raw.endswith(b'"'):
        raise KeyRuleError("the Idempotency-Key is a malformed quoted string")
    inner = raw[1:-1]
    out = bytearray()
    i = 0
    while i < len(inner):
        b = inner[i]
        if b == 0x5C:  # backslash
            if i + 1 < len(inner) and inner[i + 1] in (0x22, 0x5C):
                out.append(inner[i + 1])
                i += 2
                continue
            raise KeyRuleError("the Idempotency-Key is a malformed quoted string")
        if b == 0x22:
            raise KeyRuleError("the Idempotency-Key is a malformed quoted string")
        out.append(b)
        i += 1
    return bytes(out)


def parse_key(raw: bytes) -> str:
    """Parses one header value by the server's rules and returns the key (unquoted).

    Raises :class:`KeyRuleError` when it is empty, longer than 255 characters, not visible ASCII
    or badly quoted.
    """
    value = _trim_ows(raw)
    if value.startswith(b'"'):
        value = _unquote(value)
    if not value:
        raise KeyRuleError("the Idempotency-Key header is empty")
    for pos, b in enumerate(value):
        if not 0x21 <= b <= 0x7E:
            raise KeyRuleError(
                f"the Idempotency-Key has a character that is not visible ASCII at position {pos}"
            )
    if len(value) > MAX_KEY_LEN:
        raise KeyRuleError(f"the Idempotency-Key is {len(value)} characters long; the limit is 255")
    return value.decode("ascii")


def has_surrounding_whitespace(raw: bytes) -> bool:
    """Whether a caller's key has leading or trailing spaces or tabs. The server drops them (they
    are not part of a header value, RFC 9110 section 5.5), so it would see another key than the
    one the caller keeps to retry with later: such a key is refused before sending, in every
    Oncely SDK."""
    return raw != _trim_ows(raw)


def check_key(values: Sequence[bytes]) -> None:
    """Checks every raw value of a request's ``Idempotency-Key`` header: exactly one is allowed,
    and it must parse (:func:`parse_key`). Raises :class:`KeyRuleError`."""
    if not values:
        raise KeyRuleError("the Idempotency-Key header is missing")
    if len(values) > 1:
        raise KeyRuleError(f"the Idempotency-Key header was sent {len(values)} times; send it once")
    parse_key(values[0])


def is_valid_key(key: str) -> bool:
    """Whether ``key`` is a valid ``Idempotency-Key`` value by the server's rules."""
    try:
        parse_key(key.encode("utf-8"))
    except KeyRuleError:
        return False
    return True


def needs_key(method: str) -> bool:
    """Whether a method gets a key minted when the caller set none: ``POST`` and ``PATCH``, the
    methods RFC 9110 section 9.2.2 does not define as idempotent."""
    return method.upper() in ("POST", "PATCH")


def uuid4_key() -> str:
    """The default key maker: a random UUID v4, hyphenated lower case (36 characters)."""
    return str(uuid.uuid4())
