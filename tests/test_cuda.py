"""The engine and the training steps on a CUDA GPU, against the same oracles as on the CPU: fp32 greedy equals HF
``generate`` (on the same device) for every drafter kind, tiny DFlash, DFlash 2 and Qwen3-shaped targets, ``auto`` and a target
spread by ``device_map``; bf16 plain decoding equals ``generate`` in bf16 and a bf16 speculative decode runs; a
seeded sampled request draws the tokens plain sampling draws; a training batch lives on the device.

Every test runs on ``cpu`` too, in the normal suite, so that the GPU run meets code already checked; the ``cuda``
cases skip, saying why, where CUDA is absent. ``scripts/device_run.py`` runs this module first on a lent GPU. Imports
no Gradio (the GPU machine has none)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.oracles import NEW, PROMPTS, hf_greedy
from tests.tiny import make_dflash_drafter, make_masked_lm
from xpress_core.config import DecodeConfig
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import Models, decode_to_end
from xpress_core.models import EMBEDDED_DRAFTER, EMBEDDED_TARGET, DrafterOptions, encode_prompt, load_models

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")),
]

SETTINGS = [  # (K, T, L, verify): a chain, refined chains, trees and batches, with the refiner's passes
    (1, 1, 8, "tree"),
    (1, 3, 8, "tree"),
    (4, 1, 8, "tree"),
    (4, 2, 8, "tree"),
    (4, 2, 8, "batch"),
]


@pytest.fixture(scope="module", params=DEVICES)
def embedded(request):
    models = load_models(EMBEDDED_TARGET, str(EMBEDDED_DRAFTER), device=request.param, dtype="float32")
    prompts = [encode_prompt(models.tokenizer, p, chat=True).to(models.device) for p in PROMPTS]
    return models, prompts


def greedy_equals_generate(models: Models, cfg: DecodeConfig, prompts=PROMPTS) -> None:
    for prompt in prompts:
        prompt_ids = encode_prompt(models.tokenizer, prompt, chat=True).to(models.device)
        assert list(decode_to_end(models, prompt_ids, cfg).token_ids) == hf_greedy(models, prompt_ids)


@pytest.mark.parametrize("k,t,length,verify", SETTINGS)
def test_embedded_pair_greedy_equals_generate(embedded, k, t, length, verify):
    models, prompts = embedded
    assert models.target.device.type == models.device.type
    cfg = DecodeConfig(drafts=k, steps=t, block=length, verify=verify, max_new_tokens=NEW)
    for prompt_ids in prompts:
        assert list(decode_to_end(models, prompt_ids, cfg).token_ids) == hf_greedy(models, prompt_ids)


def test_auto_greedy_equals_generate(embedded):
    """``auto``: the controller picks K, T, L each round from the stage costs it measures on this device."""
    models, _ = embedded
    greedy_equals_generate(models, DecodeConfig(auto=True, max_new_tokens=NEW))


@pytest.mark.parametrize("seed", [0, 1])
def test_same_seed_same_tokens_as_plain_sampling(embedded, seed):
    models, prompts = embedded
    plain = Models(models.target, models.tokenizer, NoDrafter())
    cfg = DecodeConfig(temperature=0.8, top_k=20, seed=seed, drafts=4, steps=2, block=8, max_new_tokens=NEW)
    for prompt_ids in prompts:
        reference = list(decode_to_end(plain, prompt_ids, cfg).token_ids)
        assert list(decode_to_end(models, prompt_ids, cfg).token_ids) == reference
        assert list(decode_to_end(models, prompt_ids, cfg).token_ids) == reference  # and again: same seed, same


@pytest.fixture(scope="module")
def drafters(zoo, tmp_path_factory):
    """The tiny drafters of the kinds the zoo lacks: a DFlash checkpoint (written by hand in the published format)
    for the Qwen3 target, and a masked LM (a diffusion LM) sharing the zoo's tokenizer."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("cuda_drafters")
    tok = AutoTokenizer.from_pretrained(zoo["tokenizer"])
    return {"dflash": make_dflash_drafter(zoo["qwen3"], root / "dflash"), "mlm": make_masked_lm(tok, root / "mlm")}


def dflash2_drafter(target: Path, out: Path) -> Path:
    """A DFlash 2 checkpoint (convolutions, selector) built by z-lab's reference package, the format's only writer
    here; where that package is absent (a bare GPU machine) the case skips, saying so."""
    pytest.importorskip("dflash", reason="the DFlash reference package (requirements-test.txt) writes DFlash 2 here")
    from tests.reference import Variant, make_reference_drafter

    return make_reference_drafter(Variant("dflash2", kind="dflash2", block_size=8, taps=(0, 2)), target, out)


KINDS = {  # drafter kind: (target, drafter, options)
    "xpress-qwen3": ("qwen3", "drafter_qwen3", DrafterOptions()),
    "xpress-gaussian": ("llama", "gauss_llama", DrafterOptions()),
    "dflash-qwen3": ("qwen3", "dflash", DrafterOptions(kind="dflash")),
    "dflash2-qwen3": ("qwen3", "dflash2", DrafterOptions(kind="dflash")),
    "diffusion-lm": ("llama", "mlm", DrafterOptions(kind="diffusion-lm")),
    "autoregressive": ("llama", "ar_drafter", DrafterOptions(kind="autoregressive")),
    "none": ("gpt2", "none", DrafterOptions()),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_every_drafter_kind_greedy_equals_generate(zoo, drafters, kind, device, tmp_path):
    target, drafter, options = KINDS[kind]
    spec = drafters.get(drafter) or zoo.get(drafter) or drafter
    if drafter == "dflash2":
        spec = dflash2_drafter(zoo[target], tmp_path / "dflash2")
    models = load_models(zoo[target], spec, device=device, dtype="float32", drafter_options=options)
    assert models.target.device.type == device
    for cfg in (
        DecodeConfig(drafts=2, steps=2, block=4, max_new_tokens=NEW),
        DecodeConfig(drafts=1, steps=1, block=6, verify="batch", max_new_tokens=NEW),
    ):
        greedy_equals_generate(models, cfg)


@pytest.mark.parametrize("device", DEVICES)
def test_a_target_spread_by_device_map_decodes_as_generate(zoo, device):
    """accelerate's ``device_map="auto"`` (one GPU here, or the CPU: all layers on it); the drafter follows."""
    models = load_models(zoo["qwen3"], zoo["drafter_qwen3"], device=device, dtype="float32", device_map="auto")
    assert models.target.device.type == device and models.drafter.device == models.target.device
    greedy_equals_generate(models, DecodeConfig(drafts=2, steps=1, block=4, max_new_tokens=NEW))


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_plain_decoding_equals_generate_and_a_speculative_decode_runs(zoo, device):
    """bf16: plain decoding is HF's computation exactly; with a drafter, verification rounds differently from
    one-token steps in bf16, so only the prefill's token is compared, and the length."""
    for drafter in ("none", zoo["drafter_qwen3"]):
        models = load_models(zoo["qwen3"], drafter, device=device, dtype="bfloat16")
        assert models.target.dtype == torch.bfloat16
        prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True).to(models.device)
        result = decode_to_end(models, prompt_ids, DecodeConfig(drafts=3, steps=2, block=4, max_new_tokens=NEW))
        ref = hf_greedy(models, prompt_ids)
        assert list(result.token_ids) == ref if drafter == "none" else result.token_ids[0] == ref[0]


@pytest.mark.parametrize("device", DEVICES)
def test_a_co_training_batch_lives_on_the_device_in_bf16_autocast(device):
    """One ``train refiner --co-train`` step's loss on the device, as the loop computes it: finite, with gradients
    reaching the drafter and the head (every tensor of the batch on the device, or this raises)."""
    from xpress_core.drafters.diffusion_model import XpressDrafter
    from xpress_core.models import load_target
    from xpress_core.train.drafter import make_blocks, read_target
    from xpress_core.train.refiner import RefinerRecipe, attach_refiner, refiner_loss

    dev = torch.device(device)
    target, _ = load_target(str(EMBEDDED_TARGET), dev, torch.float32)
    drafter = attach_refiner(XpressDrafter.from_pretrained(EMBEDDED_DRAFTER), 128).to(dev)
    drafter.bind(target)
    recipe = RefinerRecipe(rank=128, passes=2, co_train=True, anchors=4)
    rng = np.random.default_rng(0)
    seqs = torch.from_numpy(rng.integers(10, 1000, size=(2, 64))).to(dev)
    with torch.enable_grad(), torch.autocast(device, dtype=torch.bfloat16):
        reading = read_target(target, seqs, drafter.config.tapped_layers)
        blocks = make_blocks(seqs, 31, drafter.config.block_size, recipe.anchors, rng, torch.float32, full_share=1.0)
        loss = refiner_loss(drafter, reading, blocks, recipe)
    loss.backward()
    assert blocks.attention_mask.device.type == device and math.isfinite(loss.item())
    assert drafter.refiner.hidden_in.weight.grad is not None and drafter.fc.weight.grad is not None
