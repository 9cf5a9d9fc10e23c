"""The target's attention on a CPU: transformers' ``sdpa`` everywhere but in masked forwards over several tokens (a
tree or chain verify), which run ``grouped_attention`` (docs/DESIGN.md §2.3).

Why: a verify forward passes a 4-D mask (the tree's, or the causal one HF builds for a chain after a cache), and with
a mask HF's sdpa path copies every key and value head for each query head of its group (``repeat_kv``) before the
kernel. Grouped attention stacks the query heads that share a key head along the query axis, so the keys are read as
they are, and computes scores and values in two plain products and the softmax in fp32. Measured on the embedded target
(one thread, an AVX-512 CPU; docs/experiments.md, stop 53): a layer at 33 queries over 183 keys 141 against 163 us in
fp32, 167 against 242 us in bf16; a whole 33-node verify forward 0.17 ms sooner in fp32 (of 9.1), level in bf16.

Forwards of one token (plain decoding, ``generate``'s steps) and unmasked ones (a prefill) call ``sdpa`` itself, so a
plain step is bit for bit what ``generate`` computes. A GPU keeps ``sdpa`` everywhere: its fused kernels are what a
large model's attention wants, and the CPU's fixed costs are not there. The implementation is a name registered with
transformers (``IMPLEMENTATION``), set on a loaded CPU target whose attention was ``sdpa`` (``use_grouped_attention``).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

IMPLEMENTATION = "xpress_sdpa"


def grouped_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention function (query (B, H, Q, D), key/value (B, Hkv, S, D)) -> ((B, Q, H, D), None):
    ``sdpa_attention_forward`` unless a mask is given over several queries with nothing else to apply (no dropout,
    position bias or softcap, a mask shared by the heads), else the grouped products in fp32."""
    heads, kv_heads, queries = query.shape[1], key.shape[1], query.shape[2]
    simple = dropout == 0.0 and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
    if attention_mask is None or queries == 1 or not simple or attention_mask.shape[1] != 1 or heads % kv_heads:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    return grouped_products(query, key, value, attention_mask, scale).transpose(1, 2).contiguous(), None


def grouped_products(query, key, value, mask, scale: float) -> torch.Tensor:
    """Attention of query (B, H, Q, D) over key/value (B, Hkv, S, D), H a multiple of Hkv, under ``mask`` (None, or
    (B or 1, 1, Q, S): bool = attend, or additive) -> (B, H, Q, D) in the query's dtype. The two products run in the
    inputs' dtype (in bf16 oneDNN's bf16 kernels: after 400 tokens a bf16 verify forward 0.45 ms sooner than sdpa's
    against 0.19 in fp32 products), the softmax in fp32, as transformers' eager attention rounds."""
    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    # The heads sharing a key head, one after another along the query axis: (B, Hkv, group x Q, D)
    grouped = query.reshape(batch, kv_heads, group * queries, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float().mul_(scale)  # (B, Hkv, group x Q, S)
    if mask is not None:
        scores = scores.view(batch, kv_heads, group, queries, -1)
        mask = mask[:, :, None]  # (B or 1, 1, 1, Q, S): every head of a group reads the same rows
        if mask.dtype == torch.bool:
            # finfo.min, not -inf: a row with every key masked (padding) averages the values rather than turn NaN.
            scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
        else:
            scores = scores + mask.float()
    probs = scores.softmax(-1).to(value.dtype).view(batch, kv_heads, group * queries, -1)
    return torch.matmul(probs, value).view(batch, heads, queries, dim).to(query.dtype)


def use_grouped_attention(model) -> bool:
    """Switch a CPU model whose attention is ``sdpa`` to ``IMPLEMENTATION`` (registered here, once); True if it was."""
    if model.device.type != "cpu" or model.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(IMPLEMENTATION, grouped_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    model.set_attn_implementation(IMPLEMENTATION)
    return model.config._attn_implementation == IMPLEMENTATION
