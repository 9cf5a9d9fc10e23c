"""The target's attention on a CPU: transformers' ``sdpa``, with the key heads shared rather than copied in masked
forwards over several tokens (a tree or chain verify): ``grouped_attention`` (docs/DESIGN.md §2.3).

Why: a verify forward passes a 4-D mask (the tree's, or the causal one HF builds for a chain after a cache), and with
a mask HF's sdpa path copies every key and value head for each query head of its group (``repeat_kv``) before the
kernel. Grouped attention stacks the query heads that share a key head along the query axis (their mask rows
repeated), so the same SDPA kernel reads the keys and values as they are: the same function, each query row computed
as before. Measured on the embedded target (one thread, an AVX-512 CPU; docs/experiments.md, stop 53), whole verify
forwards, paired: a chain of 9 after 150 tokens 0.23 ms sooner in bf16 and 0.25 in fp32, a 33-node tree 0.18 / 0.19,
after 400 tokens 0.20 / 0.39; the outputs equal sdpa's (to 1e-4 and below) in both dtypes.
"""

from __future__ import annotations

import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

IMPLEMENTATION = "xpress_sdpa"


def grouped_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention function (query (B, H, Q, D), key/value (B, Hkv, S, D)) -> ((B, Q, H, D), None):
    ``sdpa_attention_forward`` unless a mask is given over several queries with nothing else to apply (no dropout,
    position bias or softcap, a mask shared by the heads), else SDPA over the grouped queries."""
    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    simple = dropout == 0.0 and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
    if attention_mask is None or queries == 1 or not simple or attention_mask.shape[1] != 1 or heads % kv_heads:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    group = heads // kv_heads
    # The heads sharing a key head, one after another along the query axis: (B, Hkv, group x Q, D), and the mask's
    # (Q, S) rows once per head of a group: (B or 1, 1, group x Q, S)
    grouped = query.reshape(batch, kv_heads, group * queries, dim)
    rows = attention_mask[:, :, None].expand(-1, -1, group, -1, -1)
    mask = rows.reshape(attention_mask.shape[0], 1, group * queries, -1)
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scaling)
    return out.view(batch, heads, queries, dim).transpose(1, 2).contiguous(), None


def use_grouped_attention(model) -> bool:
    """Switch a CPU model whose attention is ``sdpa`` to ``IMPLEMENTATION`` (registered here, once); True if it was."""
    if model.device.type != "cpu" or model.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(IMPLEMENTATION, grouped_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    model.set_attn_implementation(IMPLEMENTATION)
    return model.config._attn_implementation == IMPLEMENTATION
