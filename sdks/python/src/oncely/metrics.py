"""The counters of one transport: :class:`RetryMetrics` (the Rust SDK's ``RetryMetrics``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Dict

__all__ = ["RetryMetrics"]


@dataclass
class RetryMetrics:
    """Counters of one transport (shared by its calls). Read them with :meth:`snapshot`."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    retry_after_waits: int = 0
    keys_minted: int = 0
    gave_up: int = 0
    by_reason: Dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def bump(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def gave_up_for(self, reason: str) -> None:
        with self._lock:
            self.gave_up += 1
            self.by_reason[reason] = self.by_reason.get(reason, 0) + 1

    def snapshot(self) -> Dict[str, object]:
        """A copy of the counters: ``calls``, ``attempts``, ``retries``, ``retry_after_waits``,
        ``keys_minted``, ``gave_up`` and ``by_reason`` (each error ``reason`` to its count)."""
        with self._lock:
            return {
                "calls": self.calls,
                "attempts": self.attempts,
                "retries": self.retries,
                "retry_after_waits": self.retry_after_waits,
                "keys_minted": self.keys_minted,
                "gave_up": self.gave_up,
                "by_reason": dict(self.by_reason),
            }
