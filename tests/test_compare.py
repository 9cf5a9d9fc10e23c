"""``train compare`` (train/compare.py) against its oracles: what the engine's first drafting round accepts from the
same state, and bootstrap differences whose spread is known."""

from __future__ import annotations

import argparse
import json

import pytest

from xpress_core.config import DecodeConfig
from xpress_core.data import PROMPTS
from xpress_core.engine import decode
from xpress_core.errors import XpressError
from xpress_core.models import EMBEDDED_DRAFTER, EMBEDDED_TARGET, encode_prompt, load_models
from xpress_core.train.cli import parse_settings, run_compare
from xpress_core.train.compare import accepted_at_starts, compare_drafters, paired_difference

QUICK = [json.loads(line)["messages"] for line in (PROMPTS / "quick.jsonl").read_text().splitlines()]
SETTINGS = [(1, 1, 8), (1, 3, 8), (4, 1, 8), (4, 2, 8), (2, 1, 4)]


@pytest.fixture(scope="module")
def embedded():
    models = load_models(EMBEDDED_TARGET, str(EMBEDDED_DRAFTER), device="cpu")
    return models, [encode_prompt(models.tokenizer, messages, chat=True) for messages in QUICK]


def test_each_round_start_counts_what_the_engines_round_from_there_accepts(embedded):
    """Greedy fp32: wherever a round of the engine starts (the first right after the prefill), the count at that
    round start is what the round accepted, at every setting (refined trees and chains among them)."""
    models, prompts = embedded
    seen = 0
    for prompt_ids in prompts[:3]:
        counts = accepted_at_starts([models], prompt_ids, SETTINGS, starts=24)[0]
        for (k, t, length), at_starts in zip(SETTINGS, counts):
            cfg = DecodeConfig(drafts=k, steps=t, block=length, max_new_tokens=24)
            position = 0  # new tokens before the round's root
            for trace in list(decode(models, prompt_ids, cfg))[1:-1]:
                if position < len(at_starts):
                    assert at_starts[position] == len(trace.accepted), ((k, t, length), position)
                    seen += len(trace.accepted)
                position += len(trace.emitted)
    assert seen > 0


def test_a_drafter_against_itself_differs_by_nothing(embedded):
    models, prompts = embedded
    for c in compare_drafters([models, models], prompts[:2], SETTINGS[:2], starts=6):
        assert c.accepted[0] == c.accepted[1] > 0 and c.difference == (0.0, 0.0) and c.standard_error == (0.0, 0.0)


def test_paired_differences_and_their_spread():
    # Every prompt 0.5 better: every resampling gives the same difference, so no spread.
    assert paired_difference([(1, 2), (1, 2), (3, 6)], [(2, 2), (2, 2), (6, 6)]) == (0.5, 0.0)
    # Pooled over starts, not a mean of prompts' ratios: (4 + 0) / 4 - (2 + 0) / 4.
    difference, error = paired_difference([(2, 2), (0, 2)], [(4, 2), (0, 2)])
    assert difference == pytest.approx(0.5) and 0.0 < error < 1.0


def test_settings_and_arguments_are_checked():
    assert parse_settings(["4,3,8", "1, 1, 4"]) == [(4, 3, 8), (1, 1, 4)]
    for bad in ("4,3", "a,1,8", "1,9,8", "0,1,8", "-1,1,8"):
        with pytest.raises(XpressError, match="--settings"):
            parse_settings([bad])
    args = argparse.Namespace(settings=["4,1,8"], drafter=["assets/drafter"], chats=10, starts=8)
    with pytest.raises(XpressError, match="two drafters"):
        run_compare(args)
