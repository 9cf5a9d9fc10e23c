"""Two (or more) decodes of one request, interleaved fairly: the Race of speculative against plain decoding.

Each run is an ``engine.decode`` generator. The race always advances the run that has spent less engine time, so both
progress as they would side by side on their own, and each engine's clock counts only its own work (the clock stops
while a caller holds an event).
"""

from __future__ import annotations

from collections.abc import Iterator

from .trace import DecodeResult, RoundTrace


def race(runs: dict[str, Iterator]) -> Iterator[tuple[str, RoundTrace | DecodeResult]]:
    """Interleave the runs' events as ``(run name, event)``, always advancing the one that has spent less engine time.
    Closing the race closes every run."""
    spent = {name: 0.0 for name in runs}
    try:
        while spent:
            name = min(spent, key=spent.get)
            event = next(runs[name])  # each run turns autograd off for its own work, on whichever thread
            if isinstance(event, DecodeResult):
                del spent[name]
            else:
                spent[name] = event.elapsed_s
            yield name, event
    finally:
        for run in runs.values():
            run.close()
