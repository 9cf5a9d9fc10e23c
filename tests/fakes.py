"""Fake drafters with known behaviour, to test the engine's acceptance and stopping against HF ``generate``, and
hand-made round events for the figure and verdict tests."""

from __future__ import annotations

import torch

from xpress_core.drafters.base import Drafter, Drafts, NoDrafter
from xpress_core.trace import Refinement, RoundTrace
from xpress_core.tree import DraftTree


class ScriptedDrafter(Drafter):
    """Drafts from the target's own greedy continuation of the committed tokens (recomputed by HF ``generate``).

    ``mode="oracle"``: draft 0 is the target's continuation (long acceptance); other drafts differ from it at a
    varying position. ``mode="wrong"``: every draft token differs from the target's choice (nothing is accepted).
    ``mode="second"``: draft 1 is the target's continuation, every other draft is wrong (only K >= 2 pays).
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
    def draft(self, state, root, cfg, randomness, watch):
        ids = torch.tensor([state["ids"] + [root]])
        out = self.target.generate(ids, max_new_tokens=cfg.block, do_sample=False)
        truth = out[0, ids.shape[1] :].tolist()
        truth += truth[-1:] * (cfg.block - len(truth))  # generate stopped at EOS: keep the draft length L
        vocab = self.target.config.vocab_size
        if self.mode in ("wrong", "second"):
            drafts = [[(t + 1 + k) % vocab for t in truth] for k in range(cfg.drafts)]
            if self.mode == "second" and cfg.drafts > 1:
                drafts[1] = truth
        else:
            drafts = [truth] + [
                truth[: k % len(truth)] + [(truth[k % len(truth)] + k) % vocab] + truth[k % len(truth) + 1 :]
                for k in range(1, cfg.drafts)
            ]
        return Drafts(tokens=tuple(map(tuple, drafts)))


def round_trace(
    index=1,
    steps=(),
    drafts=(),
    draft_accept_lens=(),
    accepted=(),
    emitted=(7,),
    draft_s=0.001,
    verify_s=0.002,
    other_s=0.0005,
    new_tokens_total=1,
    elapsed_s=0.01,
    setting=(1, 1, 4),
    tree: DraftTree | None = None,
    refinement: Refinement | None = None,
) -> RoundTrace:
    return RoundTrace(
        index=index,
        steps=steps,
        drafts=drafts,
        tree_tokens=tree.tokens if tree else (),
        tree_parents=tree.parents if tree else (),
        draft_accept_lens=draft_accept_lens,
        accepted=accepted,
        emitted=emitted,
        draft_s=draft_s,
        verify_s=verify_s,
        other_s=other_s,
        new_tokens_total=new_tokens_total,
        elapsed_s=elapsed_s,
        peak_mem_mb=1.0,
        cache_len=0,
        draft_context_len=0,
        setting=setting,
        refinement=refinement,
    )


class GradSpy(NoDrafter):
    """Records whether autograd was on when the engine asked for drafts."""

    def __init__(self):
        self.grad_enabled = []

    def draft(self, state, root, cfg, randomness, watch):
        self.grad_enabled.append(torch.is_grad_enabled())
        return super().draft(state, root, cfg, randomness, watch)
