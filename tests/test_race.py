"""The race of two decodes (``xpress_core.race``) on scripted runs: who advances when, and what closing does."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

from xpress_core.race import race
from xpress_core.trace import DecodeResult

DONE = object.__new__(DecodeResult)  # a run's last event; the race reads nothing from it


def scripted(name: str, elapsed: list[float], seen: list):
    """A run whose rounds report ``elapsed`` engine seconds, then ends; records each step it takes."""
    for seconds in elapsed:
        seen.append(name)
        yield SimpleNamespace(elapsed_s=seconds)
    yield DONE


def test_the_run_that_has_spent_less_engine_time_advances_first():
    seen = []
    runs = {"a": scripted("a", [0.1, 0.5, 0.6], seen), "b": scripted("b", [0.2, 0.3, 0.9], seen)}
    order = [(name, "done" if event is DONE else event.elapsed_s) for name, event in race(runs)]
    assert order == [
        ("a", 0.1),
        ("b", 0.2),
        ("a", 0.5),
        ("b", 0.3),
        ("b", 0.9),
        ("a", 0.6),
        ("a", "done"),
        ("b", "done"),
    ]
    assert seen == ["a", "b", "a", "b", "b", "a"]  # each run stepped only when its event was wanted


def test_closing_the_race_closes_every_run():
    runs = {"a": scripted("a", [0.1, 0.2], []), "b": scripted("b", [0.1, 0.2], [])}
    events = race(runs)
    assert next(events)[0] == "a" and next(events)[0] == "b"
    events.close()
    assert all(inspect.getgeneratorstate(run) == inspect.GEN_CLOSED for run in runs.values())
