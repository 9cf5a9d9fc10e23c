"""Commit helpers for the target's KV cache.

transformers' ``DynamicCache`` can crop its tail but cannot keep an arbitrary subset of positions, which is what a
tree commit needs (the root and the accepted nodes, not their rejected siblings), so these edit each layer's
keys/values directly. Sliding-window layers keep every key too (their window is a mask); recurrent and other special
layer types are refused up front by ``check_target_layers``.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .errors import XpressError

# Layer kinds whose keys and values stay addressable by position: a tree commit keeps or drops any of them. A
# sliding-window layer qualifies when its cache keeps every key (``new_cache``) and its window is a mask
# (``tree.windowed_mask``); HF's sliding cache, which forgets old keys, could not take back a rejected branch.
KEPT_LAYER_TYPES = ("full_attention", "sliding_attention")
REFUSED_LAYER_REASONS = {
    "linear_attention": "its linear-attention layers are recurrent: each keeps one running state that every verified "
    "token advances, and a rejected draft token cannot be taken back out of it",
    "chunked_attention": "its chunked-attention layers are not implemented in xPress's tree verification",
}


def check_target_layers(config) -> None:
    """Refuse, before any decoding, a target whose layers xPress cannot roll back, saying why."""
    text = getattr(config, "get_text_config", lambda: config)()
    unknown = sorted(set(getattr(text, "layer_types", None) or ()) - set(KEPT_LAYER_TYPES))
    if unknown:
        reason = REFUSED_LAYER_REASONS.get(
            unknown[0], f"its {unknown[0]} layers are not attention xPress can roll back"
        )
        raise XpressError(f"target {text.model_type!r} is not supported: {reason}")


def sliding_window(config) -> int | None:
    """The target's sliding window when some of its layers use one, else None."""
    text = getattr(config, "get_text_config", lambda: config)()
    if "sliding_attention" not in (getattr(text, "layer_types", None) or ()):
        return None
    return getattr(text, "sliding_window", None)


def new_cache(model) -> DynamicCache:
    """A cache of full layers, sliding-window ones included: they keep every key, the window being a mask."""
    if sliding_window(model.config) is not None:
        return DynamicCache()
    return DynamicCache(config=model.config)


def check_cache_supported(cache: DynamicCache) -> None:
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise XpressError(
                f"target cache layer type {type(layer).__name__} is not supported (xPress needs full-attention layers)"
            )


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def keep_tree_nodes(cache: DynamicCache, past: int, count: int, nodes: torch.Tensor | None) -> None:
    """Keep the committed prefix ``[0, past)`` and ``count`` tree nodes: ``nodes`` (count,) their ascending offsets
    after ``past`` on the device, or None when they are the first ``count`` (a single draft's accepted prefix).

    Only the tail moves: the prefix stays where it is (copying the whole cache every round would cost O(context)).
    When the kept nodes already sit first, cropping is all it takes.
    """
    kept = past + count
    if nodes is not None:
        index = nodes + past
        for layer in cache.layers:
            # index_select copies, so writing into the same tensor's tail cannot read already-moved rows.
            layer.keys[..., past:kept, :] = layer.keys.index_select(-2, index.to(layer.keys.device))
            layer.values[..., past:kept, :] = layer.values.index_select(-2, index.to(layer.values.device))
    truncate(cache, kept)


def truncate(cache: DynamicCache, length: int) -> None:
    for layer in cache.layers:
        layer.keys = layer.keys[..., :length, :]
        layer.values = layer.values[..., :length, :]


def repeat_rows(cache: DynamicCache, rows: int) -> None:
    """Batch layout: the single prefix row copied ``rows`` times (costs rows x cache memory)."""
    for layer in cache.layers:
        layer.keys = layer.keys.expand(rows, -1, -1, -1).contiguous()
        layer.values = layer.values.expand(rows, -1, -1, -1).contiguous()


def select_row(cache: DynamicCache, row: int) -> None:
    for layer in cache.layers:
        layer.keys = layer.keys[row : row + 1]
        layer.values = layer.values[row : row + 1]
