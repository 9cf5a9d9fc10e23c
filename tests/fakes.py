"""Fake drafters with known behaviour, to test the engine's acceptance and stopping against HF ``generate``."""

from __future__ import annotations

import torch

from xpress_core.drafters.base import Drafter, Drafts


class ScriptedDrafter(Drafter):
    """Drafts from the target's own greedy continuation of the committed tokens (recomputed by HF ``generate``).

    ``mode="oracle"``: draft 0 is the target's continuation (long acceptance); other drafts differ from it at a
    varying position. ``mode="wrong"``: every draft token differs from the target's choice (nothing is accepted).
    """

    name = "scripted"

    def __init__(self, target, mode: str):
        self.target, self.mode = target, mode

    def start(self, prompt_ids, features):
        return {"ids": prompt_ids[0].tolist()}

    def commit(self, state, tokens, features):
        state["ids"].extend(tokens)

    def context_length(self, state):
        return len(state["ids"])

    @torch.no_grad()
    def draft(self, state, root, cfg, generator, watch):
        ids = torch.tensor([state["ids"] + [root]])
        out = self.target.generate(ids, max_new_tokens=cfg.block, do_sample=False)
        truth = out[0, ids.shape[1] :].tolist()
        truth += truth[-1:] * (cfg.block - len(truth))  # generate stopped at EOS: keep the draft length L
        vocab = self.target.config.vocab_size
        if self.mode == "wrong":
            drafts = [[(t + 1 + k) % vocab for t in truth] for k in range(cfg.drafts)]
        else:
            drafts = [truth] + [
                truth[: k % len(truth)] + [(truth[k % len(truth)] + k) % vocab] + truth[k % len(truth) + 1 :]
                for k in range(1, cfg.drafts)
            ]
        return Drafts(tokens=tuple(map(tuple, drafts)))
