"""The one JSON convention (``xpress_core.records``): what each kind of quantity keeps, on known values."""

from __future__ import annotations

import json

from xpress_core.records import json_record


def test_floats_keep_the_decimals_of_what_they_measure():
    record = json_record(
        {
            "time_s": 1.23456789,
            "draft_time": 0.123456789,
            "tokens_per_s": 12.345678,
            "plain_tokens_per_s": 9.87654,
            "tau": 2.1234567,
            "draft_ms_per_round": 1.2345678,
            "peak_mem_mb": 123.456,
            "speedup": 1.23456,
            "speedup_min": None,
            "ms_per_token": {"draft": 0.1234567, "verify": 2.0},
            "best_xpress": {"speedup": 2.34567, "tau": 3.1234567},
            "refinement": [{"ratio": 1.23456, "draft_ms_k1": 0.1234567}],
            "token_ids": (5, 6, 7),
            "rounds": 4,
            "stop_reason": "eos",
            "matches_reference": True,
        }
    )
    assert record == {
        "time_s": 1.234568,
        "draft_time": 0.123457,
        "tokens_per_s": 12.346,
        "plain_tokens_per_s": 9.877,
        "tau": 2.1235,
        "draft_ms_per_round": 1.2346,
        "peak_mem_mb": 123.5,
        "speedup": 1.235,
        "speedup_min": None,
        "ms_per_token": {"draft": 0.1235, "verify": 2.0},
        "best_xpress": {"speedup": 2.346, "tau": 3.1235},
        "refinement": [{"ratio": 1.235, "draft_ms_k1": 0.1235}],
        "token_ids": [5, 6, 7],
        "rounds": 4,
        "stop_reason": "eos",
        "matches_reference": True,
    }
    assert json.loads(json.dumps(record)) == record  # plain JSON types only
