"""Drafting with masked diffusion: K drafts x L positions refined over T denoise steps.

Each step runs one drafter forward per refine group (all K rows at once = parallel refinement; one row at a time =
serial), then picks tokens and commits ``ceil(L*s/T)`` positions in total after step s, most confident first or left
to right. Token choice happens on the (K, L, V) logits of all rows together, so parallel and serial refinement make
the same drafts.

``MaskedDiffusionDrafter`` holds that refinement once; a drafter family only says how one forward turns a block of
committed/masked positions into logits (``denoise``): the target-conditioned drafter below, or a standalone diffusion
LM that re-reads the context (``diffusion_lm.py``).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass

import torch

from ..config import DecodeConfig
from ..errors import XpressError
from ..trace import MASKED, DenoiseStep
from .base import Drafter, Drafts, banned_token_mask, refine_groups
from .diffusion_model import ContextKV, XpressDrafter


class MaskedDiffusionDrafter(Drafter):
    """The T-step parallel refinement shared by every masked-diffusion drafter (DESIGN 2.1)."""

    banned: torch.Tensor  # (V,) bool over the vocabulary drafts may use; its length bounds the token ids
    device: torch.device

    @abstractmethod
    def denoise(self, state, root: int, tokens: torch.Tensor, committed: torch.Tensor) -> torch.Tensor:
        """One drafter forward on the rows' blocks ``[root, tokens or MASK]`` -> (R, L, V') logits, V' >= V."""

    def check_block(self, cfg: DecodeConfig) -> None:
        """Refuse a block length the drafter cannot draft (default: any length is fine)."""

    @torch.no_grad()
    def draft(self, state, root: int, cfg: DecodeConfig, generator: torch.Generator) -> Drafts:
        self.check_block(cfg)
        k, length, device = cfg.drafts, cfg.block, self.device
        tokens = torch.full((k, length), MASKED, dtype=torch.long, device=device)
        committed = torch.zeros((k, length), dtype=torch.bool, device=device)
        confidence = torch.zeros((k, length), device=device)
        steps = []
        for step in range(1, cfg.steps + 1):
            # .to(device): with a target spread over GPUs, the shared LM head may sit on another GPU than the drafter.
            logits = torch.cat(
                [self.denoise(state, root, tokens[rows], committed[rows]).to(device) for rows in refine_groups(cfg)]
            )
            candidates, candidate_conf, forced = self.choose_tokens(logits, cfg, step, generator)
            newly = self.commit_schedule(candidate_conf, committed, forced, math.ceil(length * step / cfg.steps), cfg)
            tokens = torch.where(newly, candidates, tokens)
            confidence = torch.where(committed, confidence, candidate_conf)
            committed |= newly
            steps.append(DenoiseStep(tuple(map(tuple, tokens.tolist())), tuple(map(tuple, confidence.tolist()))))
        return Drafts(tokens=tuple(map(tuple, tokens.tolist())), steps=tuple(steps))

    def choose_tokens(self, logits: torch.Tensor, cfg: DecodeConfig, step: int, generator: torch.Generator):
        """Best token and its probability per (draft, position), with the diversity strategy applied.

        Returns candidates (K, L), their confidence (K, L) and the (K, L) positions forced to commit now (branches).
        """
        logits = logits.float()[..., : self.banned.shape[0]].masked_fill(self.banned, float("-inf"))
        probs = logits.softmax(-1)  # (K, L, V)
        scores = probs.log()
        if cfg.diversity == "gumbel" and cfg.drafts > 1:
            uniform = torch.rand(probs.shape, generator=generator, device=generator.device).to(probs.device)
            scores = scores - torch.log(-torch.log(uniform.clamp_min(1e-20)))
        candidates = scores.argmax(-1)
        conf = probs.gather(-1, candidates[..., None])[..., 0]
        forced = torch.zeros_like(candidates, dtype=torch.bool)
        if cfg.diversity.startswith("branch") and cfg.drafts > 1 and step == 1:
            # Step 1 sees identical rows ([root, MASK...]), so row 0 ranks the branch tokens for all drafts.
            pos = 0 if cfg.diversity == "branch-first" else int(conf[0].argmin())
            top = probs[0, pos].topk(cfg.drafts)
            candidates[:, pos], conf[:, pos], forced[:, pos] = top.indices, top.values, True
        return candidates, conf, forced

    @staticmethod
    def commit_schedule(conf, committed, forced, total: int, cfg: DecodeConfig) -> torch.Tensor:
        """(K, L) bool: positions to commit this step so that ``total`` are committed in each row."""
        length = conf.shape[1]
        if cfg.schedule == "confidence":
            priority = conf.clone()
        else:  # left to right: earlier positions first
            priority = -torch.arange(length, device=conf.device, dtype=conf.dtype).expand_as(conf).clone()
        priority[forced] = float("inf")
        priority[committed] = float("-inf")
        count = total - int(committed[0].sum())
        chosen = priority.topk(count, dim=1).indices
        newly = torch.zeros_like(committed)
        newly.scatter_(1, chosen, True)
        return newly & ~committed


@dataclass
class DiffusionState:
    context: ContextKV  # per drafter layer (1, kv_heads, S, head_dim) keys/values of the committed context
    length: int  # S: committed tokens in the context (= target cache length)


class DiffusionDrafter(MaskedDiffusionDrafter):
    """The target-conditioned drafter (ours, or a DFlash checkpoint loaded into it): context = tapped target features."""

    name = "diffusion"

    def __init__(self, model: XpressDrafter, banned_ids: list[int]):
        self.model = model
        self.device = model.device
        self.tapped_layers = tuple(model.config.tapped_layers)
        self.max_block = model.config.block_size
        self.banned = banned_token_mask(model.config.vocab_size, banned_ids, model.device)

    def check_block(self, cfg: DecodeConfig) -> None:
        if cfg.block > self.max_block:
            raise XpressError(f"block L={cfg.block} exceeds the drafter's trained block size {self.max_block}")

    @torch.no_grad()
    def start(self, prompt_ids, features):
        n = features.shape[0]
        positions = torch.arange(n, device=features.device)[None]
        return DiffusionState(context=self.model.context_kv(features[None], positions), length=n)

    @torch.no_grad()
    def commit(self, state: DiffusionState, tokens, features):
        m = features.shape[0]
        positions = torch.arange(state.length, state.length + m, device=features.device)[None]
        new = self.model.context_kv(features[None], positions)
        state.context = [
            (torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2)) for (k, v), (nk, nv) in zip(state.context, new)
        ]
        state.length += m

    def context_length(self, state: DiffusionState) -> int:
        return state.length

    def denoise(self, state: DiffusionState, root: int, tokens: torch.Tensor, committed: torch.Tensor) -> torch.Tensor:
        """One drafter forward on the rows' blocks ``[root, tokens or MASK]`` -> (R, L, V) logits."""
        rows = tokens.shape[0]
        block = torch.cat([torch.full((rows, 1), root, device=tokens.device), tokens], dim=1)
        masked = torch.cat([torch.zeros((rows, 1), dtype=torch.bool, device=tokens.device), ~committed], dim=1)
        positions = torch.arange(state.length, state.length + block.shape[1], device=tokens.device).expand(rows, -1)
        context = [(ck.expand(rows, -1, -1, -1), cv.expand(rows, -1, -1, -1)) for ck, cv in state.context]
        return self.model(self.model.embed_block(block, masked), positions, context)[:, 1:]
