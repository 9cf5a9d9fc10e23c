"""The classic baseline: a small causal LM with the target's tokenizer drafts left to right.

K drafts branch on the drafter's top-K first tokens and continue greedily; that is L autoregressive steps, so the
denoise-step setting T does not apply (each position is one step). Its cache holds the committed context; tokens
committed by the target are fed lazily at the next draft call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import cache as kv
from ..config import DecodeConfig
from ..controller import RoundSetting
from ..packing import kernels_for
from ..trace import MASKED, DenoiseStep
from ..tree import to_device
from .base import (
    Drafter,
    DraftRandomness,
    Drafts,
    allowed_logits,
    banned_token_bias,
    choice_scores,
    logits_kept,
    refine_groups,
    top_choices,
)


@dataclass
class AutoregressiveState:
    cache: object
    length: int  # tokens in the drafter cache
    pending: list[int] = field(default_factory=list)  # committed by the target, not yet in the drafter cache


class AutoregressiveDrafter(Drafter):
    name = "autoregressive"

    def __init__(self, model, banned_ids: list[int]):
        self.model = model
        self.banned = banned_token_bias(model.config.vocab_size, banned_ids, model.device)

    @torch.no_grad()
    def start(self, prompt_ids, features):
        cache = kv.new_cache(self.model)
        ids = prompt_ids.to(self.model.device, non_blocking=True)
        self.model(input_ids=ids, cache=cache, use_cache=True, **logits_kept(self.model, 1))
        return AutoregressiveState(cache=cache, length=prompt_ids.shape[1])

    def draft_work(self, setting: RoundSetting) -> tuple[int, int]:
        """L forwards whatever T, each over one position of the K rows (parallel refinement)."""
        return setting.block, setting.block * setting.drafts

    def commit(self, state: AutoregressiveState, tokens, features):
        state.pending.extend(tokens)

    def context_length(self, state: AutoregressiveState) -> int:
        return state.length + len(state.pending)

    def next_logits(self, ids: torch.Tensor, cache) -> torch.Tensor:
        """(R, V) allowed logits after the last of each row's (R, Q) ids, the LM head run there only; one token through
        ATen's kernels where the model was timed faster so (``packing.one_token_kernels``)."""
        with kernels_for(self.model, ids):
            out = self.model(input_ids=ids, cache=cache, use_cache=True, **logits_kept(self.model, 1))
        return allowed_logits(out.logits[:, -1], self.banned)

    @torch.no_grad()
    def draft(
        self, state: AutoregressiveState, root: int, cfg: DecodeConfig, randomness: DraftRandomness, watch: bool
    ) -> Drafts:
        """Every token stays on the device, fed back as the next step's input: the drafts are read once, at the end
        (with their confidences when watched)."""

        def upcoming(position: int) -> torch.Tensor | None:
            return None if randomness.upcoming is None else randomness.upcoming[position]

        allowed = self.next_logits(to_device([state.pending + [root]], self.model.device), state.cache)[0]
        state.length += len(state.pending)
        state.pending = []
        with_root = state.length + 1
        first = allowed.softmax(-1)
        top = top_choices(choice_scores(allowed, first, cfg, upcoming(0)), first, cfg.drafts)  # (K,)
        tokens, conf = [], []  # per refine group, (rows, L)
        for rows in refine_groups(cfg):
            columns = [top[rows]]
            confidence = [first.gather(0, columns[0])]
            kv.repeat_rows(state.cache, len(columns[0]))
            for position in range(1, cfg.block):
                allowed = self.next_logits(columns[-1][:, None], state.cache)
                probs = allowed.softmax(-1)
                columns.append(choice_scores(allowed, probs, cfg, upcoming(position)).argmax(-1))
                confidence.append(probs.gather(-1, columns[-1][:, None])[:, 0])
            tokens.append(torch.stack(columns, 1))
            conf.append(torch.stack(confidence, 1))
            kv.select_row(state.cache, 0)
            kv.truncate(state.cache, with_root)
        kv.truncate(state.cache, state.length)  # the root comes back through commit with the accepted tokens
        if not watch:
            return Drafts(tokens=tuple(map(tuple, torch.cat(tokens).tolist())))
        read = torch.stack([torch.cat(tokens).double(), torch.cat(conf).double()]).tolist()  # one read
        drafted = [[int(t) for t in row] for row in read[0]]
        return Drafts(tokens=tuple(map(tuple, drafted)), steps=left_to_right_steps(drafted, read[1]))


def left_to_right_steps(tokens: list[list[int]], conf: list[list[float]]) -> tuple[DenoiseStep, ...]:
    """Autoregressive drafting seen as L steps that each commit one more position."""
    length = len(tokens[0])
    return tuple(
        DenoiseStep(
            tuple(tuple(t if j <= s else MASKED for j, t in enumerate(row)) for row in tokens),
            tuple(tuple(c if j <= s else 0.0 for j, c in enumerate(row)) for row in conf),
        )
        for s in range(length)
    )
