"""Stopping a run on SIGTERM or Ctrl-C, wherever it is.

asyncio's own SIGINT handling (Python 3.11+) only cancels the task that ``asyncio.run`` runs; a
rollout that absorbs the cancellation (its episodes end as cancelled) then returns normally and the
interrupt is lost — the run goes on. :func:`stop_on_signals` installs a handler of its own for both
signals that records which one came and raises KeyboardInterrupt where the run is; the run also
checks the record between its phases, in case a phase absorbed the exception anyway."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def stop_on_signals(on_stop: Callable[[str], None]) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT call ``on_stop(name)`` and raise KeyboardInterrupt (only in
    the main thread; elsewhere signals cannot be handled and nothing is installed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        on_stop(signal.Signals(signum).name)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
