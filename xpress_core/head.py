"""The target's LM head over the tree nodes a round reads only (docs/DESIGN.md §2.3).

Why: a verify forward over a tree of 33 nodes spends a fifth of its products in the LM head (4,096 x 256 a node on the
embedded target), and on a CPU the walk reads the logits of the nodes it visits only, about four: the forward stops
before the head (``logits_to_keep``: no position), and a node's logits are computed when the walk reads them
(``HeadRows``). A GPU draws at every node at once and computes every row, as before.

That is the model's own logits only where its logits are the output embedding of its last hidden state, nothing after
it: ``check_head`` decides, by the config (no logit softcapping or scaling) and a probe forward, and a target it does
not mark keeps its full head. It runs at the first tree verify (``plain_head``), not at load: a ZeroGPU Space loads
its models in the web process, where no forward may run.
"""

from __future__ import annotations

import inspect

import torch

# What ``check_head`` found of a target, kept on it: True where its logits come from its last hidden state alone.
PLAIN_HEAD = "xpress_plain_head"
# Config fields of families that transform the head's output (Gemma's softcapping, Cohere's and Granite's scaling).
HEAD_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
PROBE_TOKENS = 4
# Where loading keeps the module the walk computes its rows with, when not the head itself (models.keep_rows_head).
ROWS_HEAD = "xpress_rows_head"


def last_hidden_index(target) -> int:
    """The index of the final hidden state (after the last norm) in ``output_hidden_states``."""
    return target.config.get_text_config().num_hidden_layers


@torch.no_grad()
def check_head(target) -> None:
    """Mark the target (``PLAIN_HEAD``) True where its logits are its output embedding of its last hidden state (no
    head transform in its config, and a probe forward's logits within rounding of that product), else False."""
    setattr(target, PLAIN_HEAD, False)
    text = target.config.get_text_config()
    if any(getattr(text, name, None) not in (None, 0, 1, 1.0) for name in HEAD_TRANSFORMS):
        return
    head = target.get_output_embeddings()
    if head is None or "logits_to_keep" not in inspect.signature(type(target).forward).parameters:
        return
    ids = torch.arange(PROBE_TOKENS, device=target.device)[None] % head.weight.shape[0]
    out = target(input_ids=ids, use_cache=False, output_hidden_states=[last_hidden_index(target)])
    hidden = out.hidden_states[-1]
    if hidden is None or hidden.shape[:-1] != out.logits.shape[:-1]:
        return
    mine = head(hidden).float()
    scale = out.logits.float().abs().max().clamp_min(1e-6)
    if torch.allclose(mine, out.logits.float(), rtol=1e-3, atol=1e-3 * scale.item()):
        setattr(target, PLAIN_HEAD, True)


def plain_head(target) -> bool:
    """``check_head``'s finding, checked on the first call (the first tree verify, inside a GPU call on ZeroGPU)."""
    if not hasattr(target, PLAIN_HEAD):
        check_head(target)
    return getattr(target, PLAIN_HEAD)


class HeadRows:
    """(N+1, V) node logits computed when read: ``rows[node]`` one node's (V,) (the CPU's walk, node by node),
    ``rows.all()`` every node's (a GPU's draws at once). ``hidden``: (N+1, H) the nodes' last hidden states.

    The first read computes the first ``first`` nodes together (the root and the tree's first draft, its most likely
    path, which the walk reads most): in one product the head's weight is read once, where row by row it is read
    again for every row (measured in a round, one thread: a 33-row head cost about 3 ms, one row 0.3 ms). Nodes past
    them are computed one at a time."""

    def __init__(self, target, hidden: torch.Tensor, first: int):
        head = getattr(target, ROWS_HEAD, None) or target.get_output_embeddings()
        self.head, self.hidden, self.device, self.first = head, hidden, hidden.device, first
        self.rows: dict[int, torch.Tensor] = {}

    def __getitem__(self, node: int) -> torch.Tensor:
        if node not in self.rows:
            start, end = (0, self.first) if node < self.first else (node, node + 1)
            self.rows.update(zip(range(start, end), self.head(self.hidden[start:end])))
        return self.rows[node]

    def all(self) -> torch.Tensor:
        return self.head(self.hidden)


def every_row(node_logits: torch.Tensor | HeadRows) -> torch.Tensor:
    """(N+1, V): every node's logits, computed now where the verify left them to be read (``HeadRows``)."""
    return node_logits.all() if isinstance(node_logits, HeadRows) else node_logits


def headless_forward(target, tapped, first: int, **inputs) -> tuple[HeadRows, torch.Tensor | None]:
    """One target forward that stops before the LM head -> (B=1) ``HeadRows`` of its positions (``first``: the rows
    computed together) and (1, Q, F) the tapped layers' hidden states (None when none are tapped), as
    ``models.tapped_forward`` taps them."""
    last = last_hidden_index(target)
    no_rows = torch.empty(0, dtype=torch.long, device=inputs["input_ids"].device)
    out = target(**inputs, logits_to_keep=no_rows, output_hidden_states=[i + 1 for i in tapped] + [last])
    features = torch.cat([out.hidden_states[i + 1] for i in tapped], dim=-1) if tapped else None
    return HeadRows(target, out.hidden_states[last][0], first), features
