"""The embedded models in assets/ load offline, decode exactly, and ship their model cards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xpress_core.config import DecodeConfig
from xpress_core.engine import decode
from xpress_core.models import (
    EMBEDDED_AR_DRAFTER,
    EMBEDDED_DRAFTER,
    EMBEDDED_GAUSS_DRAFTER,
    EMBEDDED_TARGET,
    encode_prompt,
    load_models,
)
from xpress_core.presets import SMOLLM2_DRAFTER

ASSETS = EMBEDDED_TARGET.parent
DFLASH_DRAFTER = ASSETS / "drafter_dflash"  # for serving engines (tests/test_serving.py); the app does not offer it
PROMPTS = [
    "I want to book a table for two at an Italian restaurant tonight.",
    "Can you tell me a short story?",
    "What's the weather like in San Jose tomorrow?",
]


def test_assets_budget_and_cards():
    size = sum(f.stat().st_size for f in ASSETS.rglob("*") if f.is_file())
    assert size < 80 * 2**20  # the embedded pair and its drafters (54 MB), SmolLM2's drafter (under 25 MB, bf16)
    assert sum(f.stat().st_size for f in SMOLLM2_DRAFTER.rglob("*")) < 25 * 2**20
    for folder in (
        EMBEDDED_TARGET,
        EMBEDDED_DRAFTER,
        EMBEDDED_GAUSS_DRAFTER,
        EMBEDDED_AR_DRAFTER,
        DFLASH_DRAFTER,
        SMOLLM2_DRAFTER,
    ):
        card = (folder / "README.md").read_text()
        assert "CC BY-SA 4.0" in card and "CDLA-Sharing-1.0" in card
        assert (folder / "training_summary.json").exists()
    for folder in (EMBEDDED_DRAFTER, EMBEDDED_GAUSS_DRAFTER, EMBEDDED_AR_DRAFTER, DFLASH_DRAFTER):
        scores = json.loads((folder / "eval.json").read_text())["scores"]
        assert scores and all(s["tau"] > 1.0 for s in scores)  # tau = 1 would mean no draft token ever accepted


@pytest.mark.parametrize(
    "drafter", [EMBEDDED_DRAFTER, EMBEDDED_GAUSS_DRAFTER, EMBEDDED_AR_DRAFTER, DFLASH_DRAFTER, Path("none")]
)
def test_embedded_models_decode_exactly_like_generate(drafter):
    models = load_models(EMBEDDED_TARGET, str(drafter), device="cpu")
    assert models.tokenizer.chat_template
    for prompt in PROMPTS:
        ids = encode_prompt(models.tokenizer, prompt, chat=True)
        ref = models.target.generate(ids, max_new_tokens=40, do_sample=False)[0, ids.shape[1] :].tolist()
        for cfg in (
            DecodeConfig(drafts=1, steps=1, block=8, max_new_tokens=40),
            DecodeConfig(drafts=4, steps=2, block=8, max_new_tokens=40, verify="batch"),
        ):
            result = list(decode(models, ids, cfg))[-1]
            assert list(result.token_ids) == ref
        assert result.text.strip()
