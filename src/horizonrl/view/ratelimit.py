"""A per-client rate limit (a token bucket each): what keeps one client of the feedback API from
flooding a run's ``feedback.jsonl`` and, through it, a running stream's reward weights."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    """Each client may take ``burst`` at once, then ``per_minute`` a minute (a bucket of ``burst``
    tokens, refilled continuously). The ``max_clients`` most recently seen clients are remembered;
    a client forgotten starts again with a full bucket. Safe to call from several threads."""

    def __init__(
        self,
        per_minute: float,
        burst: int,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if per_minute <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs per_minute > 0 and burst >= 1, got {per_minute}, {burst}")
        self.rate, self.burst = per_minute / 60.0, float(burst)
        self.max_clients, self.clock = max_clients, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, when)
        self._lock = threading.Lock()

    def take(self, client: str) -> float:
        """Take one token for ``client``: 0.0 when it may go on, else the seconds until it may."""
        now = self.clock()
        with self._lock:
            tokens, then = self._buckets.pop(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.rate)
            wait = 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate
            self._buckets[client] = (tokens - 1.0 if wait == 0.0 else tokens, now)
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        return wait
