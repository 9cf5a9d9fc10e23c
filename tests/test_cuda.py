"""The engine and the training steps on a CUDA GPU, against the same oracles as on the CPU: fp32 greedy equals HF
``generate`` (on the same GPU), a seeded sampled request draws the tokens plain sampling draws, and a training batch
lives on the device. Skipped, saying why, where CUDA is absent; ``scripts/device_run.py`` runs this module on a lent
GPU. Imports no Gradio (the GPU machine has none)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.oracles import NEW, PROMPTS, hf_greedy
from xpress_core.config import DecodeConfig
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import Models, decode_to_end
from xpress_core.models import EMBEDDED_DRAFTER, EMBEDDED_TARGET, encode_prompt, load_models

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

SETTINGS = [  # (K, T, L, verify): a chain, refined chains, trees and batches, with the refiner's passes
    (1, 1, 8, "tree"),
    (1, 3, 8, "tree"),
    (4, 1, 8, "tree"),
    (4, 2, 8, "tree"),
    (4, 2, 8, "batch"),
]


@pytest.fixture(scope="module")
def embedded_cuda():
    models = load_models(EMBEDDED_TARGET, str(EMBEDDED_DRAFTER), device="cuda", dtype="float32")
    prompts = [encode_prompt(models.tokenizer, p, chat=True).to(models.device) for p in PROMPTS]
    return models, prompts


@pytest.mark.parametrize("k,t,length,verify", SETTINGS)
def test_embedded_pair_greedy_equals_generate_on_cuda(embedded_cuda, k, t, length, verify):
    models, prompts = embedded_cuda
    assert models.device.type == "cuda"
    cfg = DecodeConfig(drafts=k, steps=t, block=length, verify=verify, max_new_tokens=NEW)
    for prompt_ids in prompts:
        assert list(decode_to_end(models, prompt_ids, cfg).token_ids) == hf_greedy(models, prompt_ids)


@pytest.mark.parametrize("seed", [0, 1])
def test_same_seed_same_tokens_as_plain_sampling_on_cuda(embedded_cuda, seed):
    models, prompts = embedded_cuda
    plain = Models(models.target, models.tokenizer, NoDrafter())
    cfg = DecodeConfig(temperature=0.8, top_k=20, seed=seed, drafts=4, steps=2, block=8, max_new_tokens=NEW)
    for prompt_ids in prompts:
        reference = list(decode_to_end(plain, prompt_ids, cfg).token_ids)
        assert list(decode_to_end(models, prompt_ids, cfg).token_ids) == reference
        assert list(decode_to_end(models, prompt_ids, cfg).token_ids) == reference  # and again: same seed, same


def test_a_co_training_batch_lives_on_cuda_in_bf16_autocast():
    """One ``train refiner --co-train`` step's loss on the GPU, as the loop computes it: finite, with gradients
    reaching the drafter and the head (every tensor of the batch on the device, or this raises)."""
    from xpress_core.drafters.diffusion_model import XpressDrafter
    from xpress_core.models import load_target
    from xpress_core.train.drafter import make_blocks, read_target
    from xpress_core.train.refiner import RefinerRecipe, attach_refiner, refiner_loss

    device = torch.device("cuda")
    target, _ = load_target(str(EMBEDDED_TARGET), device, torch.float32)
    drafter = attach_refiner(XpressDrafter.from_pretrained(EMBEDDED_DRAFTER), 128).to(device)
    drafter.bind(target)
    recipe = RefinerRecipe(rank=128, passes=2, co_train=True, anchors=4)
    rng = np.random.default_rng(0)
    seqs = torch.from_numpy(rng.integers(10, 1000, size=(2, 64))).to(device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        reading = read_target(target, seqs, drafter.config.tapped_layers)
        blocks = make_blocks(seqs, 31, drafter.config.block_size, recipe.anchors, rng, torch.float32, full_share=1.0)
        loss = refiner_loss(drafter, reading, blocks, recipe)
    loss.backward()
    assert blocks.attention_mask.device.type == "cuda" and math.isfinite(loss.item())
    assert drafter.refiner.hidden_in.weight.grad is not None and drafter.fc.weight.grad is not None
