"""What one request may use: wall time and memory, checked between rounds (a sweep: between runs), so that no request
keeps the server from the others. A request past its budget ends with what it has and a message; the server goes on.

Memory is the server's resident memory grown since the request began (after its models were loaded: loading is
shared, not the request's): with requests running side by side, their growth counts for each of them, so the check
errs on ending a request early, never on letting the server run out."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_WALL_S = 300.0  # a 512-token reply with Race, or a 48-run sweep, on the embedded models fits well within it
DEFAULT_MEMORY_MB = 2048.0


@dataclass(frozen=True)
class Budget:
    wall_s: float = DEFAULT_WALL_S
    memory_mb: float = DEFAULT_MEMORY_MB


def rss_mb() -> float:
    """This process's resident memory (Linux ``/proc``; elsewhere 0: the memory budget is not enforced there)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


class Meter:
    """One request's use of its budget, read between rounds: ``over()`` says why it must end, or None."""

    def __init__(
        self, budget: Budget, clock: Callable[[], float] | None = None, memory: Callable[[], float] | None = None
    ):
        self.budget, self.clock, self.memory = budget, clock or time.monotonic, memory or rss_mb
        self.started, self.memory_at_start = self.clock(), self.memory()

    def over(self) -> str | None:
        spent = self.clock() - self.started
        if spent > self.budget.wall_s:
            return f"the request's time budget is spent ({spent:.1f} s of {self.budget.wall_s:g} s)"
        grown = self.memory() - self.memory_at_start
        if grown > self.budget.memory_mb:
            return f"the server's memory grew {grown:.0f} MB during the request (its budget: {self.budget.memory_mb:.0f} MB)"
        return None
