"""DFlash 2's additions to the drafter's layers (docs/DESIGN.md §3; ``DFLASH_FIELDS`` in ``diffusion_config.py``):
grouped dynamic causal convolutions around a layer's attention and MLP, and the candidate selector. Our own drafters
have neither (``conv_kernel_size`` and ``selector_top_k`` 0); they run DFlash 2 checkpoints (``dflash_format.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def grouped_causal_conv(x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, group: int) -> torch.Tensor:
    """DFlash 2's convolution along the block: output t = sum over lags j of (base[j] + dynamic[t, j]) * x[t - j],
    zero before the block's start. x (B, Q, H); base (kernel, H) per channel; dynamic (B, Q, kernel, H / group), one
    weight per group of ``group`` channels, computed from the position's own input. Summed lag by lag, the fixed
    kernel's term before the dynamic one, as the reference sums them (the same rounding)."""
    b, q, h = x.shape
    groups = h // group
    x = x.view(b, q, groups, group)
    dynamic = dynamic.reshape(b, q, base.shape[0], groups, 1)
    out = torch.zeros_like(x)
    for lag in range(base.shape[0]):
        shifted = x if lag == 0 else F.pad(x[:, :-lag], (0, 0, 0, 0, lag, 0))
        out = out + base[lag].view(1, 1, groups, group).to(x.dtype) * shifted
        out = torch.addcmul(out, dynamic[:, :, lag], shifted)
    return out.view(b, q, h)


class BlockConvolution(nn.Module):
    """DFlash 2's grouped dynamic causal convolution around a sublayer (attention or MLP): the sublayer's input is
    convolved before it and its output after it, both kernels' dynamic parts projected from the normed input."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden_size))  # (before / after, lag, channel)
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * (hidden_size // group_size), bias=False)

    def before(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sublayer's input (B, Q, H) convolved, and the dynamic kernel ``after`` will use."""
        dynamic = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, -1)
        return grouped_causal_conv(x, dynamic[..., 0, :, :], self.base_kernel[0], self.group_size), dynamic[
            ..., 1, :, :
        ]

    def after(self, x: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        return grouped_causal_conv(x, dynamic, self.base_kernel[1], self.group_size)


class CandidateSelector(nn.Module):
    """DFlash 2's candidate selector: a position's top tokens rescored given the token before it, by a low-rank
    bilinear term <predecessor code of the previous token * projected hidden state, successor code of the token>."""

    def __init__(self, vocab_size: int, hidden_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Embedding(vocab_size, rank)
        self.successor_codebook = nn.Embedding(vocab_size, rank)
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    def pairwise(self, projected: torch.Tensor, previous: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """projected (B, r) hidden states (``hidden_projection``), previous (B,) ids, candidates (B, C) ids -> (B, C)
        the bilinear term."""
        query = self.predecessor_codebook(previous) * projected
        return torch.einsum("br,bcr->bc", query, self.successor_codebook(candidates))
