"""The target's processed distribution, its per-token randomness, and the one draw per emitted token.

``processed_logits`` applies temperature, then top-k, then top-p, with the same semantics as transformers'
``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper`` (a test compares them), so a speculative
draw and a plain autoregressive draw see the same distribution.

A sampled token is the Gumbel-max draw ``argmax(processed logits + Gumbel noise)``, an exact sample of the processed
distribution, with one noise vector per emitted token (``TargetNoise``): the j-th emitted token always uses the j-th
vector drawn from the seeded generator, however decoding is split into rounds, so speculative sampling with seed s
gives plain sampling's tokens with seed s. The noise is fixed before the token is drawn, so a drafter may read it
(``TargetNoise.upcoming``): a draft token chosen as ``argmax(drafter's processed logits + the same noise)`` equals the
target's draw whenever the two distributions are close (Gumbel coupling: agreement at least (1 - d) / (1 + d) for
total variation d), where the drafter's most likely token is right only with the target's probability of it. The draw
itself never looks at the drafts, so the output is unchanged whatever the drafter does with the noise.
"""

from __future__ import annotations

import torch

from .config import DecodeConfig

# The smallest uniform a Gumbel variable is computed from: torch.rand can return exactly 0, whose -log(-log u) is -inf.
TINY_UNIFORM = 1e-20


def processed_logits(logits: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """(..., V) logits -> (..., V) fp32 logits of the sampler that ``cfg`` describes (tokens it never draws at -inf)."""
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
    return logits


def gumbel(uniform: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel variables from uniforms in [0, 1)."""
    return -torch.log(-torch.log(uniform.clamp_min(TINY_UNIFORM)))


def noisy_logits(logits: torch.Tensor, cfg: DecodeConfig, noise: torch.Tensor) -> torch.Tensor:
    """Processed logits plus Gumbel ``noise`` (its first V entries): their argmax is a sample of the processed
    distribution, and the same noise couples the samples of two close distributions."""
    return processed_logits(logits, cfg) + noise[..., : logits.shape[-1]].to(logits.device)


class TargetNoise:
    """The target's randomness: one vector of ``vocab_size`` Gumbel variables per emitted token, from uniforms drawn in
    order from a seeded generator. ``upcoming`` draws ahead without using them up, so the j-th token gets the j-th
    vector either way (and its Gumbel transform is computed once, for the drafter and the draw)."""

    def __init__(self, generator: torch.Generator, vocab_size: int):
        self.generator, self.vocab_size = generator, vocab_size
        self.ahead: list[torch.Tensor] = []  # drawn, not yet used, in order

    def draw(self) -> torch.Tensor:
        return gumbel(torch.rand(self.vocab_size, generator=self.generator, device=self.generator.device))

    def next(self) -> torch.Tensor:
        """(V,) noise of the next emitted token."""
        return self.ahead.pop(0) if self.ahead else self.draw()

    def upcoming(self, count: int) -> torch.Tensor:
        """(count, V) noise of the next ``count`` emitted tokens, left for them."""
        while len(self.ahead) < count:
            self.ahead.append(self.draw())
        return torch.stack(self.ahead[:count])

    def use(self, count: int) -> None:
        """The next ``count`` emitted tokens drew with the noise read ahead (``upcoming``): it is theirs, used up."""
        del self.ahead[:count]


def draw_token(logits: torch.Tensor, cfg: DecodeConfig, noise: TargetNoise) -> int:
    """One token from (V,) logits: argmax when greedy (no noise used), else the Gumbel-max draw with the next token's
    noise.

    Greedy takes max's index, the same first maximum as argmax's (both documented so): on a CPU argmax takes a slow
    path over bf16 logits (4,096 of them, one thread: 16.3 us against 6.6; fp32 5.3 against 6.6), and a round's walk
    draws about four times."""
    if cfg.greedy:
        return int(logits.max(-1).indices)
    return int(torch.argmax(noisy_logits(logits, cfg, noise.next())))
