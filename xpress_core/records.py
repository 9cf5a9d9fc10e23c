"""One JSON convention for every result xPress writes (``generate --json``, the round log, the benchmark's files,
``train eval``): keys as the result types name them, tuples as lists, and floats rounded by what they measure, so the
same quantity reads the same everywhere."""

from __future__ import annotations

from collections.abc import Mapping

RATIO_DIGITS = 3  # speedups, tree sizes, and whatever a key does not name


def digits(key: str) -> int | None:
    """Decimals kept for a float under ``key``, by what it measures; None when the key does not say."""
    if "tokens_per_s" in key:
        return 3  # throughput
    if key.endswith(("_s", "_time")):
        return 6  # seconds: microseconds matter for a single forward
    if key.endswith("_mb"):
        return 1
    if key in ("tau", "tau_without", "mean_accept_len", "forwards_per_token") or "ms" in key.split("_"):
        return 4  # per-round and per-token quantities, milliseconds
    return None


def json_record(values: Mapping[str, object], places: int = RATIO_DIGITS) -> dict:
    """``values`` ready for ``json.dumps``; a key that does not say what it measures keeps its parent's rounding (the
    parts of ``ms_per_token`` are milliseconds)."""
    return {key: json_value(value, digits(key) or places) for key, value in values.items()}


def json_value(value: object, places: int) -> object:
    if isinstance(value, float):
        return round(value, places)
    if isinstance(value, Mapping):
        return json_record(value, places)
    if isinstance(value, (tuple, list)):
        return [json_value(v, places) for v in value]
    return value
