"""The CPU target's grouped attention (xpress_core/attention.py) against transformers' own sdpa: the same function
within fp32 rounding for masked forwards over several tokens, and sdpa itself, bit for bit, everywhere else."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xpress_core.attention import IMPLEMENTATION, grouped_attention, use_grouped_attention
from xpress_core.models import load_models
from xpress_core.tree import build_tree, tree_attention_mask, tree_tensors


class Module:
    num_key_value_groups = 2
    is_causal = True
    training = False


def attention_inputs(dtype, queries=9, past=20, heads=4, kv_heads=2, dim=16, seed=0):
    probe = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, queries, dim, generator=probe).to(dtype)
    k, v = (torch.randn(1, kv_heads, past + queries, dim, generator=probe).to(dtype) for _ in range(2))
    allowed = torch.ones(queries, past + queries, dtype=torch.bool)
    allowed[:, past:] = torch.rand(queries, queries, generator=probe) < 0.5
    allowed[:, past:].fill_diagonal_(True)
    return q, k, v, allowed[None, None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("boolean", [True, False])
def test_grouped_attention_is_sdpa_with_its_mask(dtype, boolean):
    q, k, v, allowed = attention_inputs(dtype)
    mask = allowed if boolean else torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    mine, _ = grouped_attention(Module(), q, k, v, mask, scaling=0.3)
    expected = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=allowed, scale=0.3, enable_gqa=True
    )
    assert mine.shape == (1, 9, 4, 16) and mine.dtype == dtype
    # fp32 products in another order; bf16: the output rounded once (a bf16 ulp at these magnitudes)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(mine.float(), expected.transpose(1, 2), atol=tolerance, rtol=tolerance)


def test_one_query_and_unmasked_forwards_are_sdpa_bit_for_bit():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v, allowed = attention_inputs(torch.bfloat16, queries=1)
    mask = allowed.to(torch.bfloat16)
    assert torch.equal(
        grouped_attention(Module(), q, k, v, mask)[0], sdpa_attention_forward(Module(), q, k, v, mask)[0]
    )
    q, k, v, _ = attention_inputs(torch.bfloat16, past=0)
    assert torch.equal(
        grouped_attention(Module(), q, k, v, None)[0], sdpa_attention_forward(Module(), q, k, v, None)[0]
    )


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt2"])
def test_targets_verify_trees_as_sdpa_does(zoo, kind):
    """A loaded CPU target runs the grouped attention; its tree verify's logits equal sdpa's within fp32 rounding and
    its one-token forward's bit for bit."""
    models = load_models(zoo[kind], zoo[f"drafter_{kind}"], device="cpu")
    target = models.target
    assert target.config._attn_implementation == IMPLEMENTATION
    prompt = torch.arange(3, 40)[None] % target.config.vocab_size
    tree = build_tree(5, [[6, 7, 8], [6, 9], [10, 11, 12, 13]])
    outputs = {}
    for implementation in ("sdpa", IMPLEMENTATION):
        target.set_attn_implementation(implementation)
        with torch.no_grad():
            cache = target(prompt[:, :-1], use_cache=True).past_key_values
            step = target(prompt[:, -1:], cache=cache)
            tensors = tree_tensors(tree, prompt.shape[1], target.device)
            mask = tree_attention_mask(tensors, target.dtype)
            verify = target(tensors.ids, position_ids=tensors.positions, attention_mask=mask, cache=cache)
        outputs[implementation] = verify.logits, step.logits
    torch.testing.assert_close(outputs[IMPLEMENTATION][0], outputs["sdpa"][0], atol=1e-5, rtol=1e-5)
    assert torch.equal(outputs[IMPLEMENTATION][1], outputs["sdpa"][1])


def test_only_cpu_sdpa_targets_switch(zoo):
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    models.target.set_attn_implementation("eager")
    assert not use_grouped_attention(models.target)
    assert models.target.config._attn_implementation == "eager"
