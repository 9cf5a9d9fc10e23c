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
from ..trace import MASKED, DenoiseStep
from .base import (
    Drafter,
    DraftRandomness,
    Drafts,
    allowed_logits,
    banned_token_bias,
    choice_scores,
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
        self.model(input_ids=prompt_ids.to(self.model.device), cache=cache, use_cache=True)
        return AutoregressiveState(cache=cache, length=prompt_ids.shape[1])

    def draft_work(self, setting: RoundSetting) -> tuple[int, int]:
        """L forwards whatever T, each over one position of the K rows (parallel refinement)."""
        return setting.block, setting.block * setting.drafts

    def commit(self, state: AutoregressiveState, tokens, features):
        state.pending.extend(tokens)

    def context_length(self, state: AutoregressiveState) -> int:
        return state.length + len(state.pending)

    def next_logits(self, ids: list[list[int]], cache) -> torch.Tensor:
        out = self.model(input_ids=torch.tensor(ids, device=self.model.device), cache=cache, use_cache=True)
        return allowed_logits(out.logits[:, -1], self.banned)

    @torch.no_grad()
    def draft(
        self, state: AutoregressiveState, root: int, cfg: DecodeConfig, randomness: DraftRandomness, watch: bool
    ) -> Drafts:
        def upcoming(position: int) -> torch.Tensor | None:
            return None if randomness.upcoming is None else randomness.upcoming[position]

        allowed = self.next_logits([state.pending + [root]], state.cache)[0]
        state.length += len(state.pending)
        state.pending = []
        with_root = state.length + 1
        first = allowed.softmax(-1)
        top = top_choices(choice_scores(allowed, first, cfg, upcoming(0)), first, cfg.drafts)
        tokens = [[int(t)] for t in top]
        conf = [[float(first[t])] for t in top]
        for rows in refine_groups(cfg):
            kv.repeat_rows(state.cache, len(rows))
            for position in range(1, cfg.block):
                allowed = self.next_logits([[tokens[r][-1]] for r in rows], state.cache)
                probs = allowed.softmax(-1)
                best = choice_scores(allowed, probs, cfg, upcoming(position)).argmax(-1)
                for i, r in enumerate(rows):
                    tokens[r].append(int(best[i]))
                    conf[r].append(float(probs[i, best[i]]))
            kv.select_row(state.cache, 0)
            kv.truncate(state.cache, with_root)
        kv.truncate(state.cache, state.length)  # the root comes back through commit with the accepted tokens
        return Drafts(tokens=tuple(map(tuple, tokens)), steps=left_to_right_steps(tokens, conf) if watch else ())


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
