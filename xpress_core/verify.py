"""Stage 3 of a round: the target's verify forward over the draft tree (docs/DESIGN.md §2.3), in one of two layouts,
and what a commit keeps of it (``keep``): the tree layout (one row, a tree attention mask) and the batch layout (a row
per draft over copies of the cache). Each sends what it reads of the tree to the device in one copy that does not
wait for it, and finds the kept nodes there: a verify and its commit make the host wait for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import cache as kv
from .head import HeadRows, headless_forward, plain_head
from .models import Models, tapped_forward
from .packing import kernels_for
from .tree import DraftTree, to_device, tree_attention_mask, tree_tensors, windowed_mask


@dataclass(frozen=True)
class Verified:
    node_logits: torch.Tensor | HeadRows  # (N+1, V): the target's logits after each tree node (root first)
    node_features: torch.Tensor | None  # (N+1, F): tapped hidden states of each node, for the drafter
    past: int  # target cache length before the forward
    depths: torch.Tensor  # (N+1,) each node's depth, on the device (the sampled acceptance reads it)


def target_forward(models: Models, ids, positions, mask, cache, last_only: bool = False, read_first: int | None = None):
    """One target forward -> (B, Q, V) logits and (B, Q, F) tapped features (or None). ``last_only``: the logits of
    the last position only, (B, 1, V) (the LM head over a long prompt would be the largest product of a request).
    ``read_first``: the forward stops before the LM head, whose rows are computed when read (``head.HeadRows`` of
    row 0 in place of the logits, its first ``read_first`` rows together)."""
    inputs = {"input_ids": ids, "position_ids": positions, "attention_mask": mask, "cache": cache, "use_cache": True}
    if read_first is not None:
        return headless_forward(models.target, models.drafter.tapped_layers, read_first, **inputs)
    with kernels_for(models.target, ids):
        return tapped_forward(models.target, models.drafter.tapped_layers, last_only=last_only, **inputs)


@dataclass(frozen=True)
class TreeVerified(Verified):
    ancestors: torch.Tensor  # (depth+1, N+1) on the device (``TreeTensors``): a commit's kept nodes


class TreeVerifier:
    """All tree nodes in ONE forward: tree attention mask, positions ``past + depth`` (docs/DESIGN.md §2.3); the
    tree's tensors go to the device in one copy that does not wait (``tree_tensors``)."""

    def verify(self, models: Models, state, tree: DraftTree) -> TreeVerified:
        tensors = tree_tensors(tree, kv.cache_length(state.cache), models.device)
        # A chain is what causal attention over the new tokens gives anyway: without a mask the attention takes its
        # causal path (bf16, a 9-token verify: 5.9 ms against 6.0 ms with the tree mask; the same logits).
        mask = None if tree.is_chain else tree_attention_mask(tensors, models.target.dtype)
        window = None if mask is None else state.window
        if window is not None:  # per layer kind, as HF's own mask mapping
            mask = {"full_attention": mask, "sliding_attention": windowed_mask(mask, tensors, window)}
        # The LM head where the walk reads it only (head.py); a chain's rows are all computed at once anyway. The
        # walk reads the root and the first draft most: nodes 0 to its length (build_tree numbers it first).
        lazy = not tree.is_chain and plain_head(models.target)
        first = 1 + len(tree.draft_paths[0]) if lazy else None
        logits, features = target_forward(models, tensors.ids, tensors.positions, mask, state.cache, read_first=first)
        logits = logits if lazy else logits[0]
        features = None if features is None else features[0]
        return TreeVerified(logits, features, tensors.past, tensors.depths, tensors.ancestors)

    def keep(self, cache, verified: TreeVerified, kept_nodes: list[int]) -> torch.Tensor | None:
        """Keep the root and the accepted nodes in the cache (the rejected siblings leave it) -> their features.
        Their indices on the device are the last kept node's ancestors, already there: no copy."""
        count = len(kept_nodes)
        index = None if kept_nodes[-1] == count - 1 else verified.ancestors[:count, kept_nodes[-1]].flip(0)
        kv.keep_tree_nodes(cache, verified.past, count, index)
        if verified.node_features is None:
            return None
        return verified.node_features[:count] if index is None else verified.node_features.index_select(0, index)


@dataclass(frozen=True)
class BatchVerified(Verified):
    rows: tuple[int, ...]  # the batch row holding each node


class BatchVerifier:
    """The simple alternative: K rows ``[root] + draft_k`` over K copies of the prefix cache (K x cache memory)."""

    def verify(self, models: Models, state, tree: DraftTree) -> BatchVerified:
        paths = tree.draft_paths or ((),)  # an empty tree is one row holding the root
        past, device = kv.cache_length(state.cache), models.device
        # Paths of a tree may differ in length: shorter rows are padded with their root, after their nodes, where
        # causal attention keeps the padding out of every node's logits and the cache is cut after the kept path.
        width = max(len(p) for p in paths)
        rows = [[tree.tokens[0]] + [tree.tokens[n] for n in p] + [tree.tokens[0]] * (width - len(p)) for p in paths]
        source = {0: (0, 0)}  # node -> (row, column) of its first occurrence; the column is the node's depth
        for row, path in enumerate(paths):
            for col, node in enumerate(path, start=1):
                source.setdefault(node, (row, col))
        places = list(zip(*(source[n] for n in range(len(tree.tokens)))))
        # The rows' tokens, then the nodes' rows and columns, flat: one copy
        sent = to_device([t for row in rows for t in row] + [*places[0], *places[1]], device)
        ids, at = sent[: len(rows) * (width + 1)].view(len(rows), -1), sent[len(rows) * (width + 1) :].view(2, -1)
        at = (at[0], at[1])
        positions = torch.arange(past, past + ids.shape[1], device=device).expand(len(paths), -1)
        kv.repeat_rows(state.cache, len(paths))
        logits, features = target_forward(models, ids, positions, None, state.cache)
        node_features = None if features is None else features[at]
        return BatchVerified(logits[at], node_features, past, at[1], places[0])

    def keep(self, cache, verified: BatchVerified, kept_nodes: list[int]) -> torch.Tensor | None:
        """Keep the row holding the accepted path, cut after it -> the kept nodes' features."""
        kv.select_row(cache, verified.rows[kept_nodes[-1]])
        kv.truncate(cache, verified.past + len(kept_nodes))
        if verified.node_features is None:
            return None
        return verified.node_features.index_select(0, to_device(kept_nodes, verified.node_features.device))


VERIFIERS = {"tree": TreeVerifier(), "batch": BatchVerifier()}  # stateless: shared by every request
