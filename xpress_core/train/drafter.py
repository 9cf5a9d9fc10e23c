"""Step 4: train the target-conditioned diffusion drafter by self-distillation (docs/DESIGN.md §3.3).

Per batch: the frozen target reads whole distilled sequences once (its tapped hidden states are the context features);
``anchors`` random positions per sequence in the target-written part each open a block ``[x_a, x_a+1 .. x_a+L]``;
each block is masked at a random ratio (half of the blocks fully masked, the T = 1 case) and the drafter learns the
masked tokens (cross-entropy on masked positions only). The gaussian drafter reads the same blocks with that ratio
as its noise level ``t`` instead (``x_t = sqrt(a(t)) e + sqrt(1 - a(t)) eps`` at every block position but the root,
half of the blocks at ``t = 1``, pure noise, the T = 1 case) and learns every block token from them. All blocks of a
sequence go through one drafter forward: block m sees the context before its anchor and its own block, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..drafters.diffusion_model import XpressDrafter, add_noise
from .loop import TrainConfig, draw_rows, save_trained, split_held_out, train


@dataclass(frozen=True)
class DrafterBatch:
    block_ids: torch.Tensor  # (B, M*(L+1)) root + block tokens
    masked: torch.Tensor  # (B, M*(L+1)) positions given as MASK (mask noise)
    levels: torch.Tensor  # (B, M*(L+1)) noise level t of each position, 0 for the roots (gaussian noise)
    positions: torch.Tensor  # (B, M*(L+1))
    attention_mask: torch.Tensor  # (B, 1, M*(L+1), S + M*(L+1)) additive


def make_blocks(
    seqs: torch.Tensor, first_anchor: int, block: int, anchors: int, rng: np.random.Generator, dtype: torch.dtype
) -> DrafterBatch:
    b, s = seqs.shape
    span = block + 1
    starts = np.stack([rng.choice(np.arange(first_anchor, s - block), size=anchors, replace=False) for _ in range(b)])
    starts_t = torch.from_numpy(starts)  # (B, M)
    offsets = torch.arange(span)
    positions = (starts_t[..., None] + offsets).reshape(b, -1)  # (B, M*span)
    block_ids = seqs.gather(1, positions)
    ratio = torch.from_numpy(rng.uniform(0.0, 1.0, size=(b, anchors, 1))).float()
    full = torch.from_numpy(rng.uniform(size=(b, anchors, 1)) < 0.5)
    ratio = torch.where(full, torch.ones_like(ratio), ratio).clamp(min=1e-3)  # t = 0 would teach nothing
    masked = torch.from_numpy(rng.uniform(size=(b, anchors, span))).float() < ratio
    masked[..., 0] = False  # the root is always given
    none = ~masked[..., 1:].any(-1)
    masked[..., 1][none] = True  # at least one masked position per block
    q = anchors * span
    ctx_ok = torch.arange(s)[None, None, :] < starts_t[..., None]  # (B, M, S): context strictly before the anchor
    ctx_ok = ctx_ok.repeat_interleave(span, dim=1)  # (B, Q, S)
    block_of = torch.arange(q) // span
    own = (block_of[:, None] == block_of[None, :]).expand(b, q, q)
    allowed = torch.cat([ctx_ok, own], dim=-1)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    levels = ratio.expand(b, anchors, span).clone()
    levels[..., 0] = 0.0
    return DrafterBatch(block_ids, masked.reshape(b, -1), levels.reshape(b, -1), positions, mask[:, None])


@torch.no_grad()
def target_features(target, seqs: torch.Tensor, tapped_layers: list[int]) -> torch.Tensor:
    """The tapped layers' hidden states (B, S, n_tapped*H). The base model alone: training needs no target logits,
    and the LM head over the whole vocabulary is a fifth of the target's cost here."""
    out = target.base_model(input_ids=seqs, output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1] for i in tapped_layers], dim=-1)


def predicted_positions(drafter: XpressDrafter, batch: DrafterBatch) -> torch.Tensor:
    """(B, Q) bool: the block positions the drafter is asked to predict (masked ones, or every noised one)."""
    return batch.masked if drafter.config.noise == "mask" else batch.levels > 0


def block_inputs(drafter: XpressDrafter, batch: DrafterBatch, generator: torch.Generator) -> torch.Tensor:
    """(B, Q, H) drafter input: MASK vectors in the masked positions, or every block noised at its level."""
    if drafter.config.noise == "mask":
        return drafter.embed_block(batch.block_ids, batch.masked)
    clean = drafter.token_embeddings(batch.block_ids)
    noise = torch.randn(clean.shape, generator=generator).to(clean.dtype)
    return drafter.embed_noisy_block(add_noise(clean, noise, batch.levels), batch.levels)


def context_features(drafter: XpressDrafter, target, seqs: torch.Tensor):
    """Per-layer context keys/values of the drafter from the frozen target's tapped hidden states."""
    features = target_features(target, seqs, drafter.config.tapped_layers)
    b, s = seqs.shape
    return drafter.context_kv(features, torch.arange(s).expand(b, -1))


def drafter_loss(
    drafter: XpressDrafter,
    target,
    seqs: torch.Tensor,
    batch: DrafterBatch,
    decay: float,
    generator: torch.Generator,
) -> torch.Tensor:
    context = context_features(drafter, target, seqs)
    embeds = block_inputs(drafter, batch, generator)
    logits = drafter(embeds, batch.positions, context, batch.attention_mask.to(embeds.dtype))
    losses = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), batch.block_ids.reshape(-1), reduction="none"
    )
    # Acceptance stops at the first wrong token, so early block positions matter most: weight position j by
    # exp(-(j - 1) / decay) (DFlash weights its loss the same way), predicted positions only.
    span = drafter.config.block_size + 1
    offset = (torch.arange(batch.masked.shape[1]) % span).clamp(min=1).float()
    weights = torch.exp(-(offset - 1) / decay) * predicted_positions(drafter, batch).float()
    return (losses.view_as(weights) * weights).sum() / weights.sum()


@torch.no_grad()
def masked_accuracy(drafter: XpressDrafter, target, seqs: torch.Tensor, first_anchor: int, anchors: int) -> float:
    """Share of fully masked (or pure-noise) block tokens the drafter gets right in one step (a T = 1 proxy for
    acceptance); fixed blocks and noise, so the figure is comparable along a run."""
    rng = np.random.default_rng(12345)
    b = make_blocks(seqs, first_anchor, drafter.config.block_size, anchors, rng, torch.float32)
    block = torch.arange(b.masked.shape[1]) % (drafter.config.block_size + 1) > 0  # every position but the roots
    b = DrafterBatch(b.block_ids, b.masked | block, block.float().expand_as(b.levels), b.positions, b.attention_mask)
    context = context_features(drafter, target, seqs)
    embeds = block_inputs(drafter, b, torch.Generator().manual_seed(12345))
    logits = drafter(embeds, b.positions, context, b.attention_mask)
    right = (logits.argmax(-1) == b.block_ids) & block
    return float(right.sum() / block.expand_as(right).sum())


def train_drafter(
    drafter: XpressDrafter,
    target,
    seqs: torch.Tensor,
    prompt_len: int,
    cfg: TrainConfig,
    workdir: Path,
    out_dir: Path,
    tokenizer,
    anchors: int = 4,
    decay: float = 8.0,
    continued_from: dict | None = None,
) -> dict:
    """Train ``drafter`` (bound to the frozen ``target``) on distilled sequences (N, S); save to ``out_dir``."""
    for p in target.parameters():
        p.requires_grad_(False)
    drafter.bind(target)
    block = drafter.config.block_size
    held_out, train_seqs = split_held_out(seqs)
    first_anchor = prompt_len - 1  # the last prompt token is the first root: blocks cover target-written text

    def loss_fn(rng: np.random.Generator) -> torch.Tensor:
        batch_seqs = draw_rows(train_seqs, rng, cfg.batch_size)
        return drafter_loss(
            drafter,
            target,
            batch_seqs,
            make_blocks(batch_seqs, first_anchor, block, anchors, rng, torch.float32),
            decay,
            # Drawn from the step's seeded rng: a resumed run sees the noise the uninterrupted run would have.
            torch.Generator().manual_seed(int(rng.integers(2**62))),
        )

    summary = train(
        drafter,
        loss_fn,
        cfg,
        workdir,
        desc="drafter",
        eval_name="block_accuracy_T1",
        eval_fn=lambda: masked_accuracy(drafter, target, held_out[:32], first_anchor, anchors),
    )
    summary["heldout_block_accuracy_T1"] = round(masked_accuracy(drafter, target, held_out, first_anchor, anchors), 4)
    summary["distilled_sequences"] = int(seqs.shape[0])
    if continued_from:  # the --init drafter's own summary: the card then reports the whole training
        summary["continued_from"] = continued_from
    return save_trained(drafter, tokenizer, out_dir, summary)
