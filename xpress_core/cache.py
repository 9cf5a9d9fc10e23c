"""Commit helpers for the target's KV cache.

transformers' ``DynamicCache`` can crop its tail but cannot keep an arbitrary subset of positions, which is what a
tree commit needs (the root and the accepted nodes, not their rejected siblings), so these edit each layer's
keys/values directly. Sliding-window and other special layer types are refused up front by ``check_cache_supported``.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .errors import XpressError


def new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


def check_cache_supported(cache: DynamicCache) -> None:
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise XpressError(
                f"target cache layer type {type(layer).__name__} is not supported (xPress needs full-attention layers)"
            )


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def keep_tree_nodes(cache: DynamicCache, past: int, nodes: list[int]) -> None:
    """Keep the committed prefix ``[0, past)`` and the tree nodes ``nodes`` (ascending offsets after ``past``).

    Only the tail moves: the prefix stays where it is (copying the whole cache every round would cost O(context)).
    When the kept nodes already sit first (a single draft's accepted prefix), cropping is all it takes.
    """
    kept = past + len(nodes)
    if nodes != list(range(len(nodes))):
        index = torch.tensor(nodes, device=cache.layers[0].keys.device) + past
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
