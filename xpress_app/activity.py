"""How many requests the app is serving right now (replies and sweeps): a sweep says how many others ran beside it,
since they share the cores it times on (issue 39)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class InFlight:
    """A count of the requests being served, safe across Gradio's worker threads."""

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Counts one request while the block runs, however it ends."""
        with self._lock:
            self._count += 1
        try:
            yield
        finally:
            with self._lock:
                self._count -= 1

    def count(self) -> int:
        return self._count
