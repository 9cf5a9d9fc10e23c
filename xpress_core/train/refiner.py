"""Step 5: train the drafter's refiner head (docs/DESIGN.md §3.5; the head itself is ``drafters/refiner.py``).

Per batch, as the drafter's own training reads it (``train/drafter.py``): the frozen target reads whole distilled
sequences once; ``anchors`` random positions per sequence each open a block ``[x_a, MASK x L]``, masked whole (pass
0 is a one-forward draft). The drafter computes the blocks' hidden states; the head then learns, per position, the
target's distribution there (soft labels) from

- a teacher-forced pass: the true tokens one position earlier (what a pass reads once the positions before were
  drafted right, the only case in which a position's draft can be accepted), and
- free-running passes as decoding runs them: pass 1 reads pass 0's drafts (the drafter's argmax), pass p reads pass
  p - 1's, gradients stopped between passes, so the head learns to mend what its own earlier passes wrote.

Loss = teacher-forced + ``free_weight`` x the mean over the free passes (+ ``drafter_weight`` x the drafter's own
loss when the drafter is trained along, so that pass 0 does not get worse), each position weighted by
exp(-(j - 1) / decay) as in the drafter's training.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..drafters.diffusion_model import XpressDrafter
from ..drafters.refiner import previous_tokens
from ..errors import XpressError
from ..models.ours import drafter_head
from .drafter import (
    ReplyTokens,
    TargetReading,
    block_inputs,
    cached_features,
    context_features,
    distillation_loss,
    drafted_weights,
    greedy_rewritten,
    in_replies,
    make_blocks,
    per_block,
    read_target,
    reply_tokens,
    soft_targets,
)
from .loop import TrainConfig, draw_indices, save_trained, split_held_out, train


@dataclass(frozen=True)
class RefinerRecipe:
    rank: int = 128
    passes: int = 3  # free-running passes trained (decoding's T - 1)
    free_weight: float = 0.3
    drafter_weight: float = 0.6  # only when the drafter is trained along (``co_train``)
    drafter_lr: float = 1.0  # co-training: the drafter's learning rate over the head's
    co_train: bool = False
    anchors: int = 32
    decay: float = 4.0
    soft: float = 1.0
    replies_only: bool = False  # blocks and loss on reply tokens only (``in_replies``), where the rows are chats


@torch.no_grad()
def attach_refiner(drafter: XpressDrafter, rank: int) -> XpressDrafter:
    """The same drafter with a new refiner head of ``rank``, drafting exactly as before (the head starts as a no-op);
    a drafter that has a head keeps it (continued training) when the rank matches."""
    if drafter.config.noise != "mask":
        raise XpressError("a refiner head refines masked drafts: the gaussian drafter's steps are DDIM steps")
    if drafter.refiner is not None:
        if drafter.config.refiner_rank != rank:
            raise XpressError(f"the drafter's head has rank {drafter.config.refiner_rank}, not --rank {rank}")
        return drafter
    config = type(drafter.config).from_dict(drafter.config.to_dict() | {"refiner_rank": rank})
    refined = XpressDrafter(config)
    refined.load_state_dict(refined.state_dict() | drafter.state_dict())
    return refined


def block_hidden(drafter: XpressDrafter, reading: TargetReading, blocks) -> torch.Tensor:
    """(B, M, L, H) the drafter's hidden states that predict each block's tokens 1..L (pass 0's)."""
    span = drafter.config.block_size + 1
    embeds = block_inputs(drafter, blocks, reading, torch.Generator())
    context = context_features(drafter, reading.features)
    hidden = drafter.hidden(embeds, blocks.positions, context, blocks.attention_mask.to(embeds.dtype))
    return drafter.block_predictions(per_block(hidden, span))


def pass_tokens(drafter: XpressDrafter, hidden: torch.Tensor, roots: torch.Tensor, passes: int) -> list[torch.Tensor]:
    """Greedy drafts (..., L) after passes 0..``passes``: pass 0 the drafter's argmax, each next one the argmax of the
    refiner reading the pass before (``refine_passes`` as decoding runs it, greedy)."""
    tokens = [drafter.head_logits(hidden).argmax(-1)]
    for _ in range(passes):
        tokens.append(drafter.refined_logits(hidden, previous_tokens(roots, tokens[-1])).argmax(-1))
    return tokens


def refiner_loss(
    drafter: XpressDrafter, reading: TargetReading, blocks, recipe: RefinerRecipe, drafted: torch.Tensor | None = None
) -> torch.Tensor:
    """``drafted`` (B, S) bool: the positions decoding drafts; the others weigh nothing (None: every position)."""
    span = drafter.config.block_size + 1
    with torch.set_grad_enabled(recipe.co_train):
        hidden = block_hidden(drafter, reading, blocks)  # (B, M, L, H)
    ids = per_block(blocks.block_ids, span)  # (B, M, L+1): root and tokens 1..L
    roots, tokens = ids[..., 0], ids[..., 1:]
    target_logp = soft_targets(reading, per_block(blocks.positions, span)[..., 1:]) if recipe.soft > 0 else None
    weights = torch.exp(-torch.arange(span - 1, dtype=torch.float32, device=tokens.device) / recipe.decay)  # (L,)
    weights = (
        weights.expand_as(tokens) if drafted is None else weights * drafted_weights(drafted, blocks.positions, span)
    )

    def weighted(logits: torch.Tensor) -> torch.Tensor:
        losses = distillation_loss(logits, tokens, target_logp, recipe.soft)  # (B, M, L)
        return (losses * weights).sum() / weights.sum().clamp(min=1e-6)

    loss = weighted(drafter.refined_logits(hidden, previous_tokens(roots, tokens)))  # teacher-forced
    with torch.no_grad():
        drafted = drafter.head_logits(hidden).argmax(-1)
    free = []
    for _ in range(recipe.passes):
        logits = drafter.refined_logits(hidden, previous_tokens(roots, drafted))
        free.append(weighted(logits))
        drafted = logits.detach().argmax(-1)
    loss = loss + recipe.free_weight * torch.stack(free).mean()
    if recipe.co_train:
        loss = loss + recipe.drafter_weight * weighted(drafter.head_logits(hidden))
    return loss


@torch.no_grad()
def pass_agreement(
    drafter: XpressDrafter,
    target,
    seqs: torch.Tensor,
    first_anchor: int,
    anchors: int,
    passes: int,
    replies: ReplyTokens | None = None,
):
    """The learning curve per pass, on fixed fully masked blocks of ``seqs``: per pass p = 0..``passes`` and block
    position j = 1..L, the share of blocks whose draft at j equals the target's greedy token there, and the mean
    number of leading positions all right (on greedy rows: the draft tokens a greedy round of one chain accepts),
    with per position the share of blocks right up to it (``leading``).
    ``teacher_forced``: the same share when every earlier position holds the true token (the head's own accuracy);
    ``teacher_forced_accepted``: the leading positions all right so (what passes that settle on the true prefix reach;
    pass 0, the drafter's own draft, can be right where the head is not).
    With ``replies``: blocks open in the rows' replies only, and a position past the turn's end counts as wrong
    (the round stops there): what decoding a chat's reply accepts."""
    rng = np.random.default_rng(12345)
    span = drafter.config.block_size + 1
    drafted = None if replies is None else in_replies(seqs, replies)
    blocks = make_blocks(seqs, first_anchor, drafter.config.block_size, anchors, rng, torch.float32, 1.0, drafted)
    counted = 1.0 if drafted is None else drafted_weights(drafted, blocks.positions, span)  # (B, M, L)
    reading = read_target(target, seqs, drafter.config.tapped_layers)
    hidden = block_hidden(drafter, reading, blocks)
    ids = per_block(blocks.block_ids, span)
    greedy = soft_targets(reading, per_block(blocks.positions, span)[..., 1:]).argmax(-1)  # (B, M, L)
    curve = []
    for tokens in pass_tokens(drafter, hidden, ids[..., 0], passes):
        right = (tokens == greedy).float() * counted
        leading = right.cumprod(-1).mean(dim=(0, 1))  # (L,): blocks right at every position up to j
        curve.append(
            {
                "agreement": [round(float(x), 4) for x in right.mean(dim=(0, 1))],
                "leading": [round(float(x), 4) for x in leading],
                "accepted": round(float(leading.sum()), 4),
            }
        )
    forced = (drafter.refined_logits(hidden, previous_tokens(ids[..., 0], ids[..., 1:])).argmax(-1) == greedy) * counted
    teacher = [round(float(x), 4) for x in forced.float().mean(dim=(0, 1))]
    ceiling = round(float(forced.float().cumprod(-1).mean(dim=(0, 1)).sum()), 4)
    return {"passes": curve, "teacher_forced": teacher, "teacher_forced_accepted": ceiling}


def pass_gains(passes: list[dict]) -> list[list[float]]:
    """Per pass p >= 1 and block position j: the chance that j is accepted once the positions before it were (the
    ``leading`` shares' ratio), after p passes over after none: the controller's prior for T = p + 1."""

    def conditional(leading: list[float]) -> list[float]:
        return [now / before if before > 0 else 0.0 for now, before in zip(leading, [1.0, *leading[:-1]])]

    base = conditional(passes[0]["leading"])
    return [[round(q / b, 4) if b > 0 else 1.0 for q, b in zip(conditional(p["leading"]), base)] for p in passes[1:]]


def train_refiner(
    drafter: XpressDrafter,
    target,
    seqs: torch.Tensor,
    prompt_len: int,
    cfg: TrainConfig,
    recipe: RefinerRecipe,
    workdir: Path,
    out_dir: Path,
    tokenizer,
    distillation: dict | None = None,
    continued_from: dict | None = None,
    dialogue_rows: torch.Tensor | None = None,
    cache_features: bool = False,
) -> dict:
    """Train ``drafter``'s refiner head (and, with ``recipe.co_train``, the drafter along) on distilled sequences
    (N, S) with the frozen ``target``; save the drafter with its head to ``out_dir``. ``dialogue_rows``: greedy rows
    of held-out dialogues (``distill.held_out_dialogue_rows``), whose replies' curve tells runs apart.
    ``cache_features``: the target's features of the training rows read once into ``workdir`` (as the drafter's own
    training keeps them, ``train/drafter.py``), not at every step; the loss is then on the rows' tokens (soft 0)."""
    if cache_features and recipe.soft > 0:
        raise XpressError("cached features hold no logits: train the refiner with --soft 0")
    for p in target.parameters():
        p.requires_grad_(False)
    # An fp32 head beside a bf16 target: the evaluations run outside autocast, where its packed head refuses fp32 rows.
    drafter.bind(target, drafter_head(target, torch.float32))
    for name, p in drafter.named_parameters():
        p.requires_grad_(recipe.co_train or name.startswith("refiner."))
    held_out, train_seqs = split_held_out(seqs)
    first_anchor = prompt_len - 1
    held_out_greedy = greedy_rewritten(target, held_out, prompt_len)
    block = drafter.config.block_size
    replies = reply_tokens(tokenizer)
    if recipe.replies_only and replies is None:
        raise XpressError("--replies-only needs chat rows: the tokenizer has no <|assistant|> and <|end|> tokens")
    curve_passes = max(recipe.passes + 1, 4)  # one pass past the trained ones: what a longer T would add
    taps = drafter.config.tapped_layers
    features = cached_features(target, train_seqs, taps, workdir / "features") if cache_features else None

    def loss_fn(rng: np.random.Generator) -> torch.Tensor:
        rows = draw_indices(train_seqs, rng, cfg.batch_size)
        batch_seqs = train_seqs[rows]
        reading = read_target(target, batch_seqs, taps) if features is None else TargetReading(features[rows], None)
        drafted = in_replies(batch_seqs, replies) if recipe.replies_only else None
        blocks = make_blocks(batch_seqs, first_anchor, block, recipe.anchors, rng, torch.float32, 1.0, drafted)
        return refiner_loss(drafter, reading, blocks, recipe, drafted)

    def eval_fn() -> dict:
        curves = {
            "greedy": pass_agreement(drafter, target, held_out_greedy, first_anchor, recipe.anchors, curve_passes),
            "sampled": pass_agreement(drafter, target, held_out, first_anchor, recipe.anchors, curve_passes),
        }
        if dialogue_rows is not None and replies is not None:  # what decoding a held-out chat's reply accepts
            curves["dialogue_replies"] = pass_agreement(
                drafter, target, dialogue_rows, first_anchor, recipe.anchors, curve_passes, replies
            )
        return curves

    def lr_scale(name: str) -> float:
        return 1.0 if name.startswith("refiner.") else recipe.drafter_lr

    summary = train(drafter, loss_fn, cfg, workdir, desc="refiner", eval_fn=eval_fn, lr_scale=lr_scale)
    summary["heldout_refiner"] = eval_fn()
    drafter.config.refiner_gains = pass_gains(summary["heldout_refiner"]["greedy"]["passes"])
    summary["refiner_recipe"] = asdict(recipe) | {"cached_features": cache_features}
    summary["distilled_sequences"] = int(seqs.shape[0])
    summary["distillation"] = distillation
    if continued_from:  # the drafter's own training, which the card reports too
        summary["continued_from"] = continued_from
    for p in drafter.parameters():
        p.requires_grad_(True)
    return save_trained(drafter, tokenizer, out_dir, summary)
