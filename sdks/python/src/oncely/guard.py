"""Two retry layers of ours in one stack: the outer one runs the call, the inner one passes through.

The outer transport puts an :class:`ActiveCall` on the request (the :data:`ACTIVE_EXTENSION`
request extension) for the length of one logical call. An inner transport of ours that sees it
sends each attempt straight on, counting what goes out (:meth:`ActiveCall.admit`) and refusing
(:class:`Refused`) a send beyond the call's attempt limit or past its deadline. If another retry
layer between the two re-sent an attempt, the outer one stops with ``nested_retry_layer``
(:func:`nested_retry_layer`) instead of retrying. The Rust SDK's ``SendGuard`` does the same.
"""

from __future__ import annotations

import threading
from typing import Optional

from .clock import Clock
from .schedule import Stop

__all__ = ["ACTIVE_EXTENSION", "ActiveCall", "Refused", "nested_retry_layer"]

#: The request extension an outer transport of ours sets for the length of one logical call;
#: an inner one that sees it passes through (and counts what goes out).
ACTIVE_EXTENSION = "oncely.active"


class Refused(Exception):
    """An inner transport of ours refused to send (not an httpx error, so that a foreign retry
    layer between the two does not take it for a transient failure)."""

    def __init__(self, deadline: bool, max_sends: int) -> None:
        self.deadline = deadline
        self.max_sends = max_sends
        super().__init__(
            "not sent: the call's deadline has passed"
            if deadline
            else f"not sent: the call's {max_sends} requests are spent (another retry layer "
            "re-sent it)"
        )


class ActiveCall:
    """What the outer transport shares with everything below it for one logical call: at most
    ``max_sends`` requests (plus one per in-flight answer) until ``end`` (the ``clock``'s
    monotonic seconds)."""

    def __init__(self, max_sends: int, end: float, clock: Clock) -> None:
        self.max_sends = max_sends
        self.end = end
        self.clock = clock
        self.sends = 0
        # Attempts answered 409 in flight: each allows one more send, as the schedule does not
        # count them against the attempt limit.
        self.in_flight = 0
        self.last_status: Optional[int] = None
        self._lock = threading.Lock()

    def admit(self) -> None:
        """Counts one send, or raises :class:`Refused`."""
        if self.clock.monotonic() >= self.end:
            raise Refused(True, self.max_sends)
        with self._lock:
            if self.sends >= self.max_sends + self.in_flight:
                raise Refused(False, self.max_sends)
            self.sends += 1

    def allow_in_flight(self) -> None:
        """Allows one more send: an attempt was answered ``409 idempotency_request_in_flight``."""
        with self._lock:
            self.in_flight += 1


def nested_retry_layer(requests: int) -> Stop:
    """The stop of a call whose attempt went out more than once (``requests`` in all)."""
    return Stop(
        "nested_retry_layer",
        f"another retry layer below this one re-sent the request ({requests} requests in "
        "all); two retry layers in one stack are not supported, so this one did not retry",
        requests=requests,
    )
