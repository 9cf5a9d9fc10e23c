"""The target's processed distribution and the one draw per emitted token.

``processed_probs`` applies temperature, then top-k, then top-p, with the same semantics as transformers'
``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper`` (a test compares them), so a speculative
draw and a plain autoregressive draw see the same distribution.
"""

from __future__ import annotations

import torch

from .config import DecodeConfig


def processed_probs(logits: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """(..., V) logits -> (..., V) probabilities of the sampler that ``cfg`` describes (fp32)."""
    logits = logits.float() / cfg.temperature
    if cfg.top_k > 0:
        k = min(cfg.top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - cfg.top_p)
        remove_sorted[..., -1:] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits.softmax(dim=-1)


def draw_token(logits: torch.Tensor, cfg: DecodeConfig, generator: torch.Generator) -> int:
    """One token from (V,) logits: argmax when greedy, else inverse-CDF sampling with exactly one uniform draw.

    One uniform per emitted token is what makes speculative sampling with seed s reproduce plain sampling with seed s.
    """
    if cfg.greedy:
        return int(torch.argmax(logits))
    probs = processed_probs(logits, cfg)
    u = torch.rand((), generator=generator, device=generator.device).to(probs.device)
    cdf = probs.cumsum(-1)
    index = int(torch.searchsorted(cdf, u * cdf[-1], right=True))
    return min(index, probs.shape[-1] - 1)
