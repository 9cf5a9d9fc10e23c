"""The refiner: a small causal head that lets each block position see the tokens drafted before it (docs/DESIGN.md §3.5).

A one-forward block drafter picks every position from its own marginal, blind to the token drafted one position
earlier. The refiner corrects position j's logits from what the block says at positions up to j:

- per position, the drafter's final hidden state ``h_j`` (computed once per round), the block's mean hidden state,
  and the target's embedding of the token drafted at j - 1 (the root's at j = 1), each projected to rank r and added;
- a causal mix across positions: per channel, a learned lower-triangular (L, L) matrix over those inputs, on top of
  the position's own (so position j reads the tokens at 0 .. j - 1 and nothing after);
- a small SwiGLU in the rank-r space;
- a projection back to the drafter's width added to ``h_j`` (from position 2 on: position 1 reads only the root,
  which the drafter already saw), read out by the drafter's own LM head (the target's, frozen): the correction
  lives in the vocabulary's geometry instead of a V-wide matrix of its own.

The projection back starts at zero, so a drafter given a new head drafts exactly as before until the head is trained
(the mix starts at zero too: each position first learns from its own inputs, the previous token among them). Resolved by refinement passes (``refine_passes``): pass 0 is the drafter's own block; every next pass
re-reads the tokens of the pass before, at all positions at once. Position j's logits depend only on the tokens
before it, so after p passes the first p positions hold what a left-to-right walk through the head would draft, and
a block whose tokens a pass does not change is a fixed point: more passes change nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BlockRefiner(nn.Module):
    def __init__(self, hidden_size: int, rank: int, block_size: int, eps: float):
        super().__init__()
        self.hidden_in = nn.Linear(hidden_size, rank, bias=False)
        self.summary_in = nn.Linear(hidden_size, rank, bias=False)
        self.token_in = nn.Linear(hidden_size, rank, bias=False)
        # (rank, L, L): per channel, how much position j reads position i <= j's inputs (zero: reads its own only).
        self.mix = nn.Parameter(torch.zeros(rank, block_size, block_size))
        self.norm = nn.RMSNorm(rank, eps=eps)
        self.gate_up = nn.Linear(rank, 4 * rank, bias=False)
        self.down = nn.Linear(2 * rank, rank, bias=False)
        self.out = nn.Linear(rank, hidden_size, bias=False)  # zero-started (``XpressDrafter._init_weights``)

    def forward(self, hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """Corrected hidden states (..., L, H) from the drafter's (..., L, H) and the embeddings (..., L, H) of the
        tokens one position earlier (the root's first): what the LM head then reads."""
        length = hidden.shape[-2]
        inputs = (
            self.hidden_in(hidden)
            + self.summary_in(hidden.mean(-2, keepdim=True))
            + self.token_in(previous.to(hidden.dtype))
        )  # (..., L, r)
        causal = torch.tril(self.mix[:, :length, :length])  # (r, L, L)
        mixed = inputs + torch.einsum("cji,...ic->...jc", causal.to(inputs.dtype), inputs)
        gate, up = self.gate_up(self.norm(mixed)).chunk(2, dim=-1)
        correction = self.out(mixed + self.down(F.silu(gate) * up))
        # The first position reads only the root, which the drafter's block already holds: nothing for the head to
        # add there, and a correction only moves it off what the drafter learned (measured: first-position
        # agreement 0.858 corrected against 0.867).
        return hidden + torch.cat([torch.zeros_like(correction[..., :1, :]), correction[..., 1:, :]], dim=-2)


def previous_tokens(roots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(..., L) the token one position earlier than each block position, what the head reads: the root (...,), then
    the block's tokens 1..L-1."""
    return torch.cat([roots[..., None], tokens[..., :-1]], dim=-1)
