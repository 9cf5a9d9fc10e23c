"""How many requests the app is serving right now (replies and sweeps): a sweep says how many others ran beside it,
since they share the cores it times on (issue 39)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager


class InFlight:
    """A count of the requests being served, safe across Gradio's worker threads, and shared with the processes forked
    from this one (a ZeroGPU worker counts its sweep where the web process counts its replies): shared memory."""

    def __init__(self) -> None:
        self._count = multiprocessing.Value("i", 0)

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Counts one request while the block runs, however it ends."""
        with self._count.get_lock():
            self._count.value += 1
        try:
            yield
        finally:
            with self._count.get_lock():
                self._count.value -= 1

    def count(self) -> int:
        return self._count.value
