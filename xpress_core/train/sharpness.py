"""How sharply a greedy draft tree reads its drafter's distribution: the drafter's ``tree_sharpness``.

A greedy round accepts a draft token when it is the target's most likely one. A drafter trained on the target's
distributions (soft labels) says how likely the target finds each token, which understates that chance for the
leading token (a token at 0.4 against two at 0.3 is the greedy choice every time), so the tree that
``MaskedDiffusionDrafter.tree_drafts`` builds from softmax(sharpness x logits) spends its nodes better at some
sharpness above 1.

The fit measures it directly: the target's greedy replies to prompts the benchmark does not use
(``data.fitting_prompts``), every position of each reply as a round's start (the context before it committed, its
token the root), the drafter's one-step distributions there, and per candidate sharpness the tree the engine would
draft and how many of its tokens the target's reply accepts (its longest path that the reply continues: greedy
acceptance). The sharpness with the most accepted tokens wins.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import DecodeConfig
from ..drafters.base import DraftRandomness, NoDrafter
from ..drafters.masked import MaskedDiffusionDrafter
from ..engine import decode_to_end
from ..errors import XpressError
from ..models import Models, tapped_forward
from ..trace import MASKED
from ..tree import common_prefix

SHARPNESS_GRID = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5)
FIT_DRAFTS, FIT_BLOCK = 4, 8  # the tree fitted: K x L = 32 nodes, what auto and the fastest fixed settings draft
FIT_CONFIG = DecodeConfig(drafts=FIT_DRAFTS, block=FIT_BLOCK)


@dataclass(frozen=True)
class SharpnessFit:
    sharpness: float  # the candidate with the most accepted tokens (the smallest among equals)
    accepted: dict[float, float]  # per candidate: draft tokens accepted a round, over every round start
    rounds: int  # round starts measured
    prompts: int


def greedy_reply(models: Models, prompt_ids: torch.Tensor, length: int) -> torch.Tensor:
    """(1, prompt + up to ``length``) the prompt and the target's greedy reply (plain decoding, so no drafter)."""
    plain = Models(models.target, models.tokenizer, NoDrafter())
    reply = decode_to_end(plain, prompt_ids, DecodeConfig(max_new_tokens=length)).token_ids
    return torch.cat([prompt_ids[0], torch.tensor(reply, dtype=prompt_ids.dtype)])[None]


@torch.no_grad()
def round_starts(models: Models, sequence: torch.Tensor, first: int, starts: int, block: int) -> Iterator[tuple]:
    """Per round start in ``sequence`` (a prompt of ``first`` tokens and the target's greedy reply): the drafter's
    state there, the round's root and the ``block`` tokens of the reply after it (fewer at the reply's end). The
    first ``starts`` positions of the reply are starts, the first right after the prefill (the engine's first drafting
    round); the drafter's state goes as in decoding: the prompt at the start, then each root committed with its target
    features after its round's one forward."""
    drafter = models.drafter
    _, features = tapped_forward(models.target, drafter.tapped_layers, input_ids=sequence.to(models.device))
    tokens = sequence[0].tolist()
    state = drafter.start(sequence[:, :first], None if features is None else features[0, :first])
    for root_at in range(first, min(first + starts, len(tokens) - 1)):
        yield state, tokens[root_at], tokens[root_at + 1 : root_at + 1 + block]
        drafter.commit(state, [tokens[root_at]], None if features is None else features[0, root_at : root_at + 1])


@torch.no_grad()
def accepted_at_round_starts(
    models: Models, prompt_ids: torch.Tensor, max_new_tokens: int, cfg: DecodeConfig, grid: Sequence[float]
) -> list[dict[float, int]]:
    """Per round start (``round_starts``) of the target's greedy reply, the draft tokens the reply accepts from the
    round's greedy tree at each sharpness. The reply runs a block past ``max_new_tokens``, so that every start sees a
    block of it (or the reply's real end)."""
    drafter = models.drafter
    sequence = greedy_reply(models, prompt_ids, max_new_tokens + cfg.block)
    masked = torch.full((1, cfg.block), MASKED, dtype=torch.long, device=drafter.device)
    committed = torch.zeros((1, cfg.block), dtype=torch.bool, device=drafter.device)
    counts = []
    for state, root, continuation in round_starts(models, sequence, prompt_ids.shape[1], max_new_tokens, cfg.block):
        logits = drafter.denoise(state, root, masked, committed)[0]
        count = {}
        for sharpness in grid:
            drafter.tree_sharpness = sharpness
            tree = drafter.tree_drafts(logits, masked[0], committed[0], cfg, DraftRandomness(None), [], False)
            count[sharpness] = max(common_prefix(path, continuation) for path in tree.tokens)
        counts.append(count)
    return counts


def fit_sharpness(
    models: Models,
    prompts: Sequence[torch.Tensor],
    grid: Sequence[float] = SHARPNESS_GRID,
    max_new_tokens: int = 128,
    cfg: DecodeConfig = FIT_CONFIG,
) -> SharpnessFit:
    """The sharpness among ``grid`` whose greedy trees at ``cfg``'s (K, 1, L) get the most draft tokens accepted."""
    drafter = models.drafter
    if not isinstance(drafter, MaskedDiffusionDrafter):
        raise XpressError(f"tree sharpness is a masked diffusion drafter's setting, not a {type(drafter).__name__}'s")
    if drafter.max_block is not None and cfg.block > drafter.max_block:
        cfg = DecodeConfig(drafts=cfg.drafts * cfg.block // drafter.max_block, block=drafter.max_block)
    kept = drafter.tree_sharpness
    try:
        counts = [
            c for prompt_ids in prompts for c in accepted_at_round_starts(models, prompt_ids, max_new_tokens, cfg, grid)
        ]
    finally:
        drafter.tree_sharpness = kept
    rounds = len(counts)
    if not rounds:
        raise XpressError("the fit needs replies of two tokens or more: the target ended every reply at once")
    accepted = {s: sum(c[s] for c in counts) / rounds for s in grid}
    return SharpnessFit(max(grid, key=lambda s: (accepted[s], -s)), accepted, rounds, len(prompts))


def kept_config(drafter_dir: Path) -> Path:
    """The config.json a fitted sharpness is kept in: a local drafter folder's, which must exist."""
    path = drafter_dir / "config.json"
    if not path.is_file():
        raise XpressError(
            f"--write keeps the sharpness in a local drafter folder's config.json; {drafter_dir} has none (download "
            "the drafter to a folder and fit that)"
        )
    return path


def write_sharpness(drafter_dir: Path, sharpness: float) -> Path:
    """Keep the fitted sharpness in a local drafter folder's config.json, where the drafter loader reads it (ours,
    DFlash checkpoints and diffusion LMs alike; their own code ignores the extra field)."""
    path = kept_config(drafter_dir)
    config = json.loads(path.read_text())
    config["tree_sharpness"] = sharpness
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path
