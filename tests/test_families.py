"""Which targets work: the support matrix (README "Use real models"). For each family that published DFlash drafters
serve, a tiny random model built offline from transformers' own config class, with a drafter of ours: either exact
(fp32 greedy equals HF ``generate`` with a draft tree and with a chain, sampling gives plain sampling's tokens at the
same seed) or refused at load, before any decoding, with the reason."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.models.gemma4 import Gemma4ForCausalLM, Gemma4TextConfig
from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from tests.oracles import check_invariants, hf_greedy, run
from tests.test_packing import ProductsRun, needs_bf16_packing, shared_count, unpacked_models
from tests.tiny import _common, make_tokenizer
from xpress_core.config import DecodeConfig
from xpress_core.errors import XpressError
from xpress_core.models import encode_prompt, init_drafter, load_models

SIZE = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "head_dim": 16}
SLIDING = {"layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "sliding_window": 4}
# family -> (config class, model class, fields beyond SIZE): three layers each, sliding windows shorter than a prompt.
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {}),
    "qwen3-moe": (
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    ),
    # Sliding windows, soft-capped logits, scaled embeddings, per-layer inputs, a layer reusing another's keys/values.
    "gemma4": (
        Gemma4TextConfig,
        Gemma4ForCausalLM,
        SLIDING
        | {
            "final_logit_softcapping": 5.0,
            "vocab_size_per_layer_input": 320,
            "hidden_size_per_layer_input": 8,
            "global_head_dim": 32,
            "num_kv_shared_layers": 1,
        },
    ),
    # Attention sinks, sliding windows, experts.
    "gpt-oss": (GptOssConfig, GptOssForCausalLM, SLIDING | {"num_local_experts": 4, "num_experts_per_tok": 2}),
}
REFUSED = {
    # Hybrid: gated delta-rule (linear attention) layers beside full attention.
    "qwen3.5": (
        Qwen3_5ForCausalLM,
        Qwen3_5TextConfig,
        {"layer_types": ["linear_attention", "full_attention", "full_attention"]},
        "linear-attention layers are recurrent",
    ),
}
NEW = 24
PROMPTS = ["Once upon a time", "Please find me a flight from New York"]


def make_family_target(config_class, model_class, fields: dict, tok, out):
    torch.manual_seed(0)
    config = config_class(**SIZE, num_hidden_layers=3, max_position_embeddings=512, **_common(tok), **fields)
    model = model_class(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("families") / "tok")


@pytest.mark.parametrize("family", FAMILIES)
def test_family_is_exact(family, tok, tmp_path):
    target = make_family_target(*FAMILIES[family], tok, tmp_path / family)
    init_drafter(target, tmp_path / "drafter", layers=1, block=4)
    models = load_models(target, tmp_path / "drafter", device="cpu", dtype="float32")
    plain = load_models(target, "none", device="cpu", dtype="float32")
    settings = [
        DecodeConfig(drafts=3, block=4, max_new_tokens=NEW),  # a draft tree: the tree mask in the verify forward
        DecodeConfig(drafts=1, block=4, diversity="none", max_new_tokens=NEW),  # a chain: the model's own causal mask
        DecodeConfig(drafts=2, block=3, diversity="branch-first", verify="batch", max_new_tokens=NEW),
    ]
    for prompt in PROMPTS:
        prompt_ids = encode_prompt(models.tokenizer, prompt, chat=True)
        ref = hf_greedy(models, prompt_ids, new=NEW)
        for cfg in settings:
            traces, result = run(models, prompt_ids, cfg)
            assert list(result.token_ids) == ref, (family, cfg)
            check_invariants(traces, prompt_ids.shape[1], result)
        sampled = DecodeConfig(drafts=2, block=4, temperature=0.9, seed=7, max_new_tokens=NEW)
        assert run(models, prompt_ids, sampled)[1].token_ids == run(plain, prompt_ids, sampled)[1].token_ids


@pytest.mark.parametrize("family,fields,theta", [("llama", {"rope_theta": 1e5}, 1e5), ("gemma4", {}, 1e6)])
def test_a_new_drafter_shares_the_targets_rope_base(family, fields, theta, tok, tmp_path):
    """``init_drafter`` reads the RoPE base where transformers 5 keeps it (``rope_parameters``; per layer type in a
    family with sliding layers: the full-attention layers'), not 10000 (a SmolLM2 target, 100000, got 10000)."""
    config_class, model_class, family_fields = FAMILIES[family]
    target = make_family_target(config_class, model_class, family_fields | fields, tok, tmp_path / family)
    assert init_drafter(target, tmp_path / "drafter", layers=1, block=4).config.rope_theta == theta


@needs_bf16_packing
@pytest.mark.parametrize("family", FAMILIES)
def test_family_in_bf16_shares_its_projections_products_and_decodes_as_unpacked(family, tok, tmp_path, monkeypatch):
    """bf16 on a CPU: each layer's q/k/v and gate/up read one packed product (``packing.fuse_shared_inputs``; qk-norm,
    biases, experts, layers that reuse another's keys/values), and greedy ``generate`` and the engine's tokens are the
    unpacked models' wherever every product a run made gives ``F.linear``'s outputs bit for bit (``ProductsRun``)."""
    target = make_family_target(*FAMILIES[family], tok, tmp_path / family)
    init_drafter(target, tmp_path / "drafter", layers=1, block=4)
    models = load_models(target, tmp_path / "drafter", device="cpu", dtype="bfloat16")
    plain = unpacked_models(monkeypatch, target, tmp_path / "drafter", device="cpu", dtype="bfloat16")
    assert shared_count(models.target) > 0
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[1], chat=True)
    with ProductsRun([models.target]) as run_products:
        got = hf_greedy(models, prompt_ids, new=NEW)
    run_products.check(lambda: got == hf_greedy(plain, prompt_ids, new=NEW))
    cfg = DecodeConfig(drafts=3, block=4, max_new_tokens=NEW)
    with ProductsRun([models.target, models.drafter.model]) as run_products:
        got = run(models, prompt_ids, cfg)[1].token_ids
    run_products.check(lambda: got == run(plain, prompt_ids, cfg)[1].token_ids)


@pytest.mark.parametrize("family", REFUSED)
def test_family_is_refused_at_load_with_the_reason(family, tok, tmp_path):
    model_class, config_class, fields, reason = REFUSED[family]
    target = make_family_target(config_class, model_class, fields, tok, tmp_path / family)
    with pytest.raises(XpressError, match=reason):
        load_models(target, "none", device="cpu", dtype="float32")
