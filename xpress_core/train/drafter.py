"""Step 4: train the target-conditioned diffusion drafter by self-distillation (docs/DESIGN.md §3.3).

Per batch: the frozen target reads whole distilled sequences once (its tapped hidden states are the context features);
``anchors`` random positions per sequence in the target-written part each open a block ``[x_a, x_a+1 .. x_a+L]``;
each block is masked at a random ratio (a share of the blocks fully masked, the T = 1 case: half by default) and the
drafter learns the masked tokens (cross-entropy on masked positions only). The gaussian drafter reads the same blocks
with that ratio as its noise level ``t`` instead (``x_t = sqrt(a(t)) e + sqrt(1 - a(t)) eps`` at every block position
but the root, the same share of the blocks at ``t = 1``, pure noise, the T = 1 case) and learns every block token from
them. All blocks of a sequence go through one drafter forward: block m sees the context before its anchor and its own
block, nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..drafters.diffusion_model import XpressDrafter, add_noise
from ..errors import XpressError
from ..models import tapped_forward
from ..models.ours import drafter_head
from .distill import PAD, continue_batch, unpadded
from .loop import TrainConfig, draw_indices, save_trained, split_held_out, train
from .tokenizer import SPECIAL


@dataclass(frozen=True)
class DrafterBatch:
    block_ids: torch.Tensor  # (B, M*(L+1)) root + block tokens
    masked: torch.Tensor  # (B, M*(L+1)) positions given as MASK (mask noise)
    levels: torch.Tensor  # (B, M*(L+1)) noise level t of each position, 0 for the roots (gaussian noise)
    positions: torch.Tensor  # (B, M*(L+1))
    attention_mask: torch.Tensor  # (B, 1, M*(L+1), S + M*(L+1)) additive


def make_blocks(
    seqs: torch.Tensor,
    first_anchor: int,
    block: int,
    anchors: int,
    rng: np.random.Generator,
    dtype: torch.dtype,
    full_share: float = 0.5,
    drafted: torch.Tensor | None = None,
) -> DrafterBatch:
    """``anchors`` blocks per sequence, each masked at a ratio drawn from U(0, 1], or fully (``full_share`` of them).
    Drawn on the CPU from ``rng`` (the same blocks on every device), returned on ``seqs``' device. ``drafted`` (B, S)
    bool: only blocks whose first token is drafted (``in_replies``) open, as many as there are, drawn again if fewer."""
    b, s = seqs.shape
    span = block + 1
    candidates = np.arange(first_anchor, s - block)
    anchors = min(anchors, candidates.size)  # every target-written position can open a block; never more
    if drafted is None:
        starts = np.stack([rng.choice(candidates, size=anchors, replace=False) for _ in range(b)])
    else:
        starts = np.stack([drafted_anchors(candidates, row, anchors, rng) for row in drafted.cpu().numpy()])
    starts_t = torch.from_numpy(starts)  # (B, M)
    offsets = torch.arange(span)
    positions = (starts_t[..., None] + offsets).reshape(b, -1)  # (B, M*span)
    block_ids = seqs.gather(1, positions.to(seqs.device))
    ratio = torch.from_numpy(rng.uniform(0.0, 1.0, size=(b, anchors, 1))).float()
    full = torch.from_numpy(rng.uniform(size=(b, anchors, 1)) < full_share)
    ratio = torch.where(full, torch.ones_like(ratio), ratio).clamp(min=1e-3)  # t = 0 would teach nothing
    masked = torch.from_numpy(rng.uniform(size=(b, anchors, span))).float() < ratio
    masked[..., 0] = False  # the root is always given
    none = ~masked[..., 1:].any(-1)
    masked[..., 1][none] = True  # at least one masked position per block
    q = anchors * span
    ctx_ok = torch.arange(s)[None, None, :] < starts_t[..., None]  # (B, M, S): context strictly before the anchor
    ctx_ok = ctx_ok & (seqs != PAD).cpu()[:, None, :]  # a clean opening's pad is no context
    ctx_ok = ctx_ok.repeat_interleave(span, dim=1)  # (B, Q, S)
    block_of = torch.arange(q) // span
    own = (block_of[:, None] == block_of[None, :]).expand(b, q, q)
    allowed = torch.cat([ctx_ok, own], dim=-1)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    levels = ratio.expand(b, anchors, span).clone()
    levels[..., 0] = 0.0
    on = seqs.device
    return DrafterBatch(
        block_ids, masked.reshape(b, -1).to(on), levels.reshape(b, -1).to(on), positions.to(on), mask[:, None].to(on)
    )


def drafted_anchors(candidates: np.ndarray, drafted: np.ndarray, anchors: int, rng: np.random.Generator) -> np.ndarray:
    """``anchors`` of ``candidates`` whose next token is drafted (``drafted`` (S,) bool); drawn with repeats when
    fewer are, and from all candidates when none is (their blocks then weigh nothing: ``drafted_weights``)."""
    opening = candidates[drafted[candidates + 1]]
    if opening.size == 0:
        opening = candidates
    return rng.choice(opening, size=anchors, replace=opening.size < anchors)


@dataclass(frozen=True)
class ReplyTokens:
    opens: int  # the role token after which the target writes its reply
    closes: int  # the token that ends a turn (decoding stops once it is accepted)


def reply_tokens(tokenizer) -> ReplyTokens | None:
    """The chat rows' reply delimiters, for a tokenizer that has this project's role tokens (None otherwise: every
    target-written token is then drafted text)."""
    vocab = tokenizer.get_vocab()
    if SPECIAL.assistant not in vocab or SPECIAL.end_of_turn not in vocab:
        return None
    return ReplyTokens(vocab[SPECIAL.assistant], vocab[SPECIAL.end_of_turn])


def in_replies(seqs: torch.Tensor, replies: ReplyTokens) -> torch.Tensor:
    """(B, S) bool: the positions that hold a token of a reply (after its opening role token, up to and with the
    token that ends the turn): what decoding drafts. A distilled row goes on past the reply into the user's next
    turn, written by the target as well, which no decoding round ever drafts: 41-44 % of the target-written tokens
    of this project's distillation (its first reply's median is 16 tokens of the 96)."""
    b, s = seqs.shape
    marks = (seqs == replies.opens).long() - (seqs == replies.closes).long()  # +1 opens a reply, -1 ends a turn
    index = torch.arange(s, device=seqs.device).expand(b, s)
    last = torch.where(marks != 0, index, -1).cummax(dim=1).values  # the latest mark at or before each position
    opened = (marks.gather(1, last.clamp(min=0)) == 1) & (last >= 0)
    inside = torch.zeros_like(opened)
    inside[:, 1:] = opened[:, :-1]  # a token is in a reply when the reply was open before it (the closing one too)
    return inside


def drafted_weights(drafted: torch.Tensor, positions: torch.Tensor, span: int) -> torch.Tensor:
    """(B, M, L) 1 where block position j and every one before it are drafted text, else 0: past a turn's end no
    round drafts, so no loss and no credit there."""
    return per_block(drafted.gather(1, positions), span)[..., 1:].float().cumprod(-1)


@dataclass(frozen=True)
class TargetReading:
    features: torch.Tensor  # (B, S, n_tapped*H) tapped hidden states: the drafter's context
    logits: torch.Tensor | None  # (B, S, V) the target's next-token logits: the soft labels (None: read from a cache)


@torch.no_grad()
def read_target(target, seqs: torch.Tensor, tapped_layers: list[int]) -> TargetReading:
    """One teacher-forced read of whole sequences: the drafter's context features and the target's distribution at
    every position (position p predicts token p + 1), so every block drawn from the sequence gets soft labels. A
    clean opening's pad (``distill.PAD``) is masked out of the read, and its features are zero (no block's context
    holds it: ``make_blocks``)."""
    ids, mask = unpadded(seqs)
    logits, features = tapped_forward(target, tapped_layers, input_ids=ids, attention_mask=mask)
    return TargetReading(features if mask is None else features.masked_fill(mask[..., None] == 0, 0.0), logits)


FEATURE_CHUNK = 256  # rows read per saved chunk of the feature cache: an interrupted read resumes by chunk


@torch.no_grad()
def cached_features(target, seqs: torch.Tensor, tapped_layers: list[int], folder: Path, batch: int = 16):
    """(N, S, F) bf16 tapped features of every row, read once and kept in ``folder`` (resumable, by chunk).

    Why: with a 135M target (SmolLM2, 30 layers) its forward over a batch costs several times the drafter's step, and
    the features of a row are the same at every epoch; soft labels (the target's logits over 49k words a position)
    are too large to keep, so a cached run trains on the sequence's tokens (``--soft 0``)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = {"rows": int(seqs.shape[0]), "length": int(seqs.shape[1]), "taps": list(tapped_layers)}
    manifest = folder / "features.json"
    if manifest.exists() and json.loads(manifest.read_text()) != key:
        raise XpressError(f"{folder} caches features of other rows or taps ({manifest.read_text()}): remove it")
    manifest.write_text(json.dumps(key))
    chunks = []
    for start in tqdm(range(0, seqs.shape[0], FEATURE_CHUNK), desc="target features", mininterval=5):
        path = folder / f"features_{start // FEATURE_CHUNK:05d}.pt"
        if not path.exists():
            rows = seqs[start : start + FEATURE_CHUNK]
            read = [
                read_target(target, rows[i : i + batch], tapped_layers).features for i in range(0, len(rows), batch)
            ]
            torch.save(torch.cat(read).to(torch.bfloat16).cpu(), path.with_suffix(".tmp"))
            path.with_suffix(".tmp").rename(path)
        chunks.append(torch.load(path, weights_only=True))
    return torch.cat(chunks).to(seqs.device)


def predicted_positions(drafter: XpressDrafter, batch: DrafterBatch) -> torch.Tensor:
    """(B, Q) bool: the block positions the drafter is asked to predict (masked ones, or every noised one)."""
    return batch.masked if drafter.config.noise == "mask" else batch.levels > 0


def block_inputs(
    drafter: XpressDrafter, batch: DrafterBatch, reading: TargetReading, generator: torch.Generator
) -> torch.Tensor:
    """(B, Q, H) drafter input: MASK vectors in the masked positions, or every block noised at its level; with
    ``fuse_previous``, plus the features of the token before each block's root."""
    if drafter.config.noise == "mask":
        embeds = drafter.embed_block(batch.block_ids, batch.masked)
    else:
        clean = drafter.token_embeddings(batch.block_ids)
        noise = torch.randn(clean.shape, generator=generator).to(clean.device, clean.dtype)  # CPU-drawn: resumable
        embeds = drafter.embed_noisy_block(add_noise(clean, noise, batch.levels), batch.levels)
    if drafter.previous_proj is None:
        return embeds
    span = drafter.config.block_size + 1
    before_root = (per_block(batch.positions, span)[:, :, :1] - 1).expand(-1, -1, span).reshape(embeds.shape[:2])
    index = before_root[..., None].expand(-1, -1, reading.features.shape[-1])
    return drafter.with_previous(embeds, reading.features.gather(1, index))


def context_features(drafter: XpressDrafter, features: torch.Tensor):
    """Per-layer context keys/values of the drafter from the frozen target's tapped hidden states (B, S, F)."""
    b, s, _ = features.shape
    return drafter.context_kv(features, torch.arange(s, device=features.device).expand(b, -1))


def soft_targets(reading: TargetReading, positions: torch.Tensor) -> torch.Tensor:
    """(B, ..., V) the target's log-probabilities for the tokens at ``positions`` (B, ...): token p is predicted at
    position p - 1."""
    flat = (positions.reshape(positions.shape[0], -1) - 1).clamp(min=0)
    index = flat[..., None].expand(-1, -1, reading.logits.shape[-1])
    return reading.logits.gather(1, index).float().log_softmax(-1).view(*positions.shape, -1)


def distillation_loss(logits: torch.Tensor, tokens: torch.Tensor, target_logp: torch.Tensor, soft: float):
    """Per position: soft * KL(p_target || q_drafter) + (1 - soft) * CE(token); (B, Q, V) logits -> (B, Q).

    The KL teaches the target's whole distribution at every position (its ranking of the runners-up too), where
    the CE sees one token, a sample when the sequence was sampled."""
    logq = logits.float().log_softmax(-1)
    loss = torch.zeros(tokens.shape, device=logits.device)
    if soft > 0:
        loss = loss + soft * (target_logp.exp() * (target_logp - logq)).sum(-1)
    if soft < 1:
        loss = loss + (1 - soft) * -logq.gather(-1, tokens[..., None])[..., 0]
    return loss


def per_block(x: torch.Tensor, span: int) -> torch.Tensor:
    """(B, M*span, ...) -> (B, M, span, ...): the blocks of a batch side by side."""
    return x.view(x.shape[0], -1, span, *x.shape[2:])


def drafter_loss(
    drafter: XpressDrafter,
    reading: TargetReading,
    batch: DrafterBatch,
    decay: float,
    soft: float,
    generator: torch.Generator,
) -> torch.Tensor:
    span = drafter.config.block_size + 1
    context = context_features(drafter, reading.features)
    embeds = block_inputs(drafter, batch, reading, generator)
    logits = drafter(embeds, batch.positions, context, batch.attention_mask.to(embeds.dtype))  # (B, Q, V)
    predictions = drafter.block_predictions(per_block(logits, span))  # (B, M, L, V): tokens 1..L of each block
    block_tokens = per_block(batch.positions, span)[:, :, 1:]  # (B, M, L): the roots have no label
    target_logp = soft_targets(reading, block_tokens) if soft > 0 else None
    losses = distillation_loss(predictions, per_block(batch.block_ids, span)[:, :, 1:], target_logp, soft)
    # Acceptance stops at the first wrong token, so early block positions matter most: weight position j by
    # exp(-(j - 1) / decay) (DFlash weights its loss the same way), predicted positions only.
    decays = torch.exp(-torch.arange(span - 1, dtype=torch.float32, device=losses.device) / decay)  # (L,)
    weights = decays * per_block(predicted_positions(drafter, batch), span)[:, :, 1:].float()
    return (losses * weights).sum() / weights.sum()


@torch.no_grad()
def extend_drafter(
    drafter: XpressDrafter,
    taps: list[int],
    block: int | None = None,
    layers: int | None = None,
    fuse_previous: bool = False,
) -> XpressDrafter:
    """The same drafter reading more target layers, deeper, or trained for another block size, for continued
    training, drafting exactly as the old one did at the start.

    The new taps' fusion weights start at zero, so training only adds what the new layers tell; new drafter layers
    go on top with their output projections at zero (each adds nothing to the residual stream until trained); the
    previous token's input (``fuse_previous``) starts at zero too; the block size sets no weight (rotary positions)."""
    old = list(drafter.config.tapped_layers)
    if not set(old) <= set(taps):
        raise XpressError(f"--taps {taps} must keep the init drafter's taps {old} (their weights are trained)")
    depth = drafter.config.num_hidden_layers
    if layers and layers < depth:
        raise XpressError(f"--layers {layers} is fewer than the init drafter's {depth}")
    config = drafter.config.to_dict() | {
        "tapped_layers": sorted(taps),
        "block_size": block or drafter.config.block_size,
        "num_hidden_layers": max(layers or 0, depth),
        "fuse_previous": drafter.config.fuse_previous or fuse_previous,
    }
    extended = XpressDrafter(type(drafter.config).from_dict(config))
    for layer in extended.layers[depth:]:
        layer.attn.o_proj.weight.zero_()
        layer.down_proj.weight.zero_()
    extended.load_state_dict(
        extended.state_dict() | drafter.state_dict() | {"fc.weight": fusion_by_tap(drafter, extended)}
    )
    return extended


def fusion_by_tap(source: XpressDrafter, new: XpressDrafter) -> torch.Tensor:
    """``new``'s fusion weight (H, n_taps * H), one H-wide slice per tapped layer: the source's slice for a layer
    both tap, zero for a layer only ``new`` taps (it adds nothing until trained)."""
    hidden = source.config.hidden_size
    fc = torch.zeros_like(new.fc.weight)
    for i, layer in enumerate(source.config.tapped_layers):
        if layer in new.config.tapped_layers:
            j = new.config.tapped_layers.index(layer)
            fc[:, j * hidden : (j + 1) * hidden] = source.fc.weight[:, i * hidden : (i + 1) * hidden]
    return fc


@torch.no_grad()
def in_dflash_layout(drafter: XpressDrafter, taps: list[int]) -> XpressDrafter:
    """A drafter in the DFlash layout (what serving engines load) that starts from a trained drafter of another
    layout: its layers, norms and the fusion slices of the layers both tap are copied; the per-head query and key
    norms start at one, masked positions read the target's embedding of the mask token instead of a learned vector,
    a refiner head is dropped, and a tap left out (the target's last layer, which engines read differently) loses
    its slice. It drafts worse than the source at first and needs continued training (``assets/drafter_dflash``:
    τ 2.78 after 250 steps, 3.21 after 2,500; no fresh drafter was trained beside it: docs/experiments.md, "Served by
    vLLM")."""
    config = drafter.config.to_dict() | {
        "tapped_layers": sorted(taps),
        "qk_norm": True,
        "learned_mask": False,
        "refiner_rank": 0,
        "refiner_gains": None,
    }
    relaid = XpressDrafter(type(drafter.config).from_dict(config))
    fusion = {"fc.weight": fusion_by_tap(drafter, relaid)}
    kept = {k: v for k, v in drafter.state_dict().items() if k in relaid.state_dict() and k != "fc.weight"}
    relaid.load_state_dict(relaid.state_dict() | kept | fusion)
    return relaid


@torch.no_grad()
def block_agreement(drafter: XpressDrafter, target, seqs: torch.Tensor, first_anchor: int, anchors: int) -> list[float]:
    """Per block position j = 1..L: the share of fully masked (or pure-noise) blocks whose one-step (T = 1) draft at
    j equals the target's greedy token there, given the true prefix. On greedy rows that is the chance that a
    greedy round accepts position j once the positions before it were accepted: a cheap proxy for tau. Fixed blocks
    and noise, so the figures are comparable along a run."""
    rng = np.random.default_rng(12345)
    span = drafter.config.block_size + 1
    b = make_blocks(seqs, first_anchor, drafter.config.block_size, anchors, rng, torch.float32)
    block = torch.arange(b.masked.shape[1], device=seqs.device) % span > 0  # every position but the roots
    b = DrafterBatch(b.block_ids, b.masked | block, block.float().expand_as(b.levels), b.positions, b.attention_mask)
    reading = read_target(target, seqs, drafter.config.tapped_layers)
    embeds = block_inputs(drafter, b, reading, torch.Generator().manual_seed(12345))
    logits = drafter(embeds, b.positions, context_features(drafter, reading.features), b.attention_mask)
    greedy = soft_targets(reading, per_block(b.positions, span)[:, :, 1:]).argmax(-1)
    right = (drafter.block_predictions(per_block(logits, span)).argmax(-1) == greedy).float()  # (B, M, L)
    return [round(float(x), 4) for x in right.mean(dim=(0, 1))]


def greedy_rewritten(target, seqs: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """The held-out rows' prompts continued greedily by the target, as long as the rows. Why: the held-out rows are
    the distillation's first, all sampled, while greedy decoding drafts into greedy-written text, which the drafter
    predicts better and which its training rows repeat exactly across epochs (a greedy continuation of a prompt is
    always the same): agreement on these rows shows whether it learned greedy text or remembered it."""
    return continue_batch(target, seqs[:, :prompt_len], seqs.shape[1] - prompt_len, 0.0, None)


@torch.no_grad()
def tie_key_norms(drafter: XpressDrafter) -> None:
    """Give every layer the same per-head key norm (their mean) and freeze it. vLLM's CPU backend normalises the
    context keys of all layers with the first layer's key norm (one kernel call over the stacked layers): a drafter
    whose key norms are equal is read alike by both engines (docs/experiments.md, "Served by vLLM")."""
    norms = [layer.attn.k_norm.weight for layer in drafter.layers]
    mean = torch.stack(norms).mean(0)
    for weight in norms:
        weight.copy_(mean)
        weight.requires_grad_(False)


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
    soft: float = 0.0,
    full_share: float = 0.5,
    tau_eval: Callable[[], dict] | None = None,
    continued_from: dict | None = None,
    distillation: dict | None = None,
    cache_features: bool = False,
) -> dict:
    """Train ``drafter`` (bound to the frozen ``target``) on distilled sequences (N, S); save to ``out_dir``.

    ``soft``: weight of the KL to the target's distribution against the CE on the sequence's token (1 = KL only).
    ``full_share``: the share of blocks masked whole (the T = 1 case), the others at a ratio drawn from U(0, 1].
    ``tau_eval``: measures tau on held-out prompts with the engine (the learning curve), at every evaluation.
    ``distillation``: the settings that wrote ``seqs`` (``distill.distillation_record``), kept in the summary.
    ``cache_features``: read the target over the training rows once (``cached_features``), not at every step."""
    for p in target.parameters():
        p.requires_grad_(False)
    # An fp32 head for the fp32 drafter beside a bf16 target (--target-dtype bf16): its evaluations and the tau decodes
    # run outside autocast, where the target's own head, packed for bf16, refuses fp32 rows.
    drafter.bind(target, drafter_head(target, torch.float32))
    block = drafter.config.block_size
    held_out, train_seqs = split_held_out(seqs)
    first_anchor = prompt_len - 1  # the last prompt token is the first root: blocks cover target-written text
    held_out_greedy = greedy_rewritten(target, held_out, prompt_len)
    taps = drafter.config.tapped_layers
    if cache_features and soft > 0:
        raise XpressError("cached features hold no logits: train with soft = 0")
    features = cached_features(target, train_seqs, taps, workdir / "features") if cache_features else None

    def reading(rows: torch.Tensor) -> TargetReading:
        if features is None:
            return read_target(target, train_seqs[rows], taps)
        return TargetReading(features[rows], None)

    def loss_fn(rng: np.random.Generator) -> torch.Tensor:
        rows = draw_indices(train_seqs, rng, cfg.batch_size)
        batch_seqs = train_seqs[rows]
        return drafter_loss(
            drafter,
            reading(rows),
            make_blocks(batch_seqs, first_anchor, block, anchors, rng, torch.float32, full_share),
            decay,
            soft,
            # Drawn from the step's seeded rng: a resumed run sees the noise the uninterrupted run would have.
            torch.Generator().manual_seed(int(rng.integers(2**62))),
        )

    def agreements() -> dict:
        return {
            "block_agreement_T1": block_agreement(drafter, target, held_out, first_anchor, anchors),
            "block_agreement_T1_greedy": block_agreement(drafter, target, held_out_greedy, first_anchor, anchors),
        }

    def eval_fn() -> dict:
        return agreements() | (tau_eval() if tau_eval else {})

    summary = train(drafter, loss_fn, cfg, workdir, desc="drafter", eval_fn=eval_fn)
    summary |= {f"heldout_{key}": value for key, value in agreements().items()}
    summary["distilled_sequences"] = int(seqs.shape[0])
    summary["recipe"] = {
        "anchors": anchors,
        "decay": decay,
        "soft": soft,
        "full_share": full_share,
        "batch_size": cfg.batch_size,
        "cached_features": cache_features,
    }
    summary["distillation"] = distillation
    if continued_from:  # the --init drafter's own summary: the card then reports the whole training
        summary["continued_from"] = continued_from
    return save_trained(drafter, tokenizer, out_dir, summary)


def store_bf16(folder: Path) -> None:
    """Rewrite the trained drafter in ``folder`` in bf16: half the file, and the dtype the engine runs it in on CPU."""
    XpressDrafter.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(folder)
