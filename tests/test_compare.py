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
from xpress_core.train.compare import accepted_per_prompt, compare_drafters, paired_difference

QUICK = [json.loads(line)["messages"] for line in (PROMPTS / "quick.jsonl").read_text().splitlines()]
SETTINGS = [(1, 1, 8), (1, 3, 8), (4, 1, 8), (4, 2, 8), (2, 1, 4)]


@pytest.fixture(scope="module")
def embedded():
    models = load_models(EMBEDDED_TARGET, str(EMBEDDED_DRAFTER), device="cpu")
    return models, [encode_prompt(models.tokenizer, messages, chat=True) for messages in QUICK]


def test_the_first_round_start_accepts_what_the_engines_first_round_does(embedded):
    """Greedy fp32: the first round start is the engine's first drafting round (the prefill's token its root), so
    each setting's count there is that round's accepted length."""
    models, prompts = embedded
    accepted_somewhere = False
    for prompt_ids in prompts:
        counts = accepted_per_prompt([models], prompt_ids, SETTINGS, starts=1)[0]
        for (k, t, length), (accepted, starts) in zip(SETTINGS, counts):
            cfg = DecodeConfig(drafts=k, steps=t, block=length, max_new_tokens=length + 2)
            first_round = list(decode(models, prompt_ids, cfg))[1]
            assert starts == 1 and accepted == first_round.accept_len
            accepted_somewhere |= accepted > 0
    assert accepted_somewhere


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
