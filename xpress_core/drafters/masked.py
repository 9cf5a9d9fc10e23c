"""The T-step masked refinement every masked-diffusion drafter shares: K drafts x L positions over T denoise steps.

``MaskedDiffusionDrafter`` holds it once: each step runs one drafter forward per refine group (all K rows at once =
parallel refinement; one row at a time = serial), then picks tokens and commits ``ceil(L*s/T)`` positions in total
after step s, most confident first or left to right. The first step needs one row only: every row starts as
``[root, MASK x L]``, so K drafts at T = 1 cost one draft's forward (they part at the branch tokens). Token choice
happens on the (K, L, V) logits of all rows together, so parallel and serial refinement make the same drafts. A masked
family only says how one forward turns a block of committed/masked positions into logits (``denoise``): our
target-conditioned drafter (``diffusion.py``), or a standalone diffusion LM that re-reads the context
(``diffusion_lm.py``). With diversity "tree" (the default) one row is refined and its last step's distributions shape
a draft tree of K x L tokens instead (``tree_drafts``, docs/DESIGN.md §2.2).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import replace

import torch
import torch.nn.functional as F

from ..config import TREE, DecodeConfig
from ..controller import RoundSetting
from ..sampling import gumbel
from ..trace import MASKED, DenoiseStep
from ..tree import best_first_paths
from .base import (
    Drafter,
    DraftRandomness,
    Drafts,
    allowed_logits,
    choice_scores,
    read_top,
    refine_groups,
    top_choices,
)


def stacked(parts: list[torch.Tensor]) -> torch.Tensor:
    """The groups' logits as one (K, L, V) tensor; one group (parallel refinement) is used as it is, not copied."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class MaskedDiffusionDrafter(Drafter):
    """The T-step parallel refinement shared by every masked-diffusion drafter (docs/DESIGN.md §2.1)."""

    banned: torch.Tensor  # (V,) additive, -inf at tokens drafts may not use (banned_token_bias); V bounds the ids
    device: torch.device
    tree_sharpness: float = 1.0  # greedy trees: chances from softmax(sharpness x logits) (XpressDrafterConfig)
    offers_chances = True

    def draft_work(self, setting: RoundSetting) -> tuple[int, int]:
        """T forwards: the first over one row (all K rows start the same), the others over K rows of L + 1 (a draft
        tree refines one row at every step: the same work at T = 1)."""
        span = setting.block + 1
        return setting.steps, span + (setting.steps - 1) * setting.drafts * span

    @abstractmethod
    def denoise(self, state, root: int, tokens: torch.Tensor, committed: torch.Tensor) -> torch.Tensor:
        """One drafter forward on the rows' blocks ``[root, tokens or MASK]`` -> (R, L, V') logits, V' >= V."""

    def first_denoise(self, state, root: int, tokens: torch.Tensor, committed: torch.Tensor) -> torch.Tensor:
        """``denoise`` of one row ``[root, MASK x L]`` (the first step's: ``tokens`` (1, L) all MASKED, ``committed``
        (1, L) all False); a family may build that block more directly."""
        return self.denoise(state, root, tokens, committed)

    @torch.no_grad()
    def draft(self, state, root: int, cfg: DecodeConfig, randomness: DraftRandomness, watch: bool) -> Drafts:
        # A tree refines one row; its last step's distributions shape the tree (``tree_drafts``).
        tree = cfg.diversity == TREE
        rows = replace(cfg, drafts=1) if tree else cfg
        k, length, device = rows.drafts, cfg.block, self.device
        tokens = torch.full((k, length), MASKED, dtype=torch.long, device=device)
        committed = torch.zeros((k, length), dtype=torch.bool, device=device)
        confidence = torch.zeros((k, length), device=device) if watch else None
        steps, groups = [], refine_groups(rows)
        for step in range(1, cfg.steps + 1):
            # .to(device): with a target spread over GPUs, the shared LM head may sit on another GPU than the drafter.
            if step == 1:  # every row is still [root, MASK x L]: one row's forward and token choice serve all K
                logits = self.first_denoise(state, root, tokens[:1], committed[:1]).to(device)
            else:
                logits = stacked([self.denoise(state, root, tokens[r], committed[r]).to(device) for r in groups])
            if tree and step == cfg.steps:
                if self.chooses_in_order(cfg):  # the tree reads each position's scores given the chain's token before
                    logits = self.chain_tokens(state, root, logits[:1], tokens[:1], committed[:1], rows, randomness)[1]
                return self.tree_drafts(logits[0], tokens[0], committed[0], cfg, randomness, steps, watch)
            # The last step commits every position left whatever their confidence: only the visualizer asks for it.
            ranked = watch or step < cfg.steps
            candidates, candidate_conf, forced = self.choose_tokens(logits, rows, step, randomness, ranked)
            if step == cfg.steps and self.chooses_in_order(rows):
                candidates, candidate_conf = self.chosen_in_order(
                    state, root, logits, candidates, committed, forced, rows, randomness, watch
                )
            done, total = (math.ceil(length * s / cfg.steps) for s in (step - 1, step))  # committed before, after
            newly = self.commit_schedule(candidate_conf, committed, forced, done, total, rows)
            tokens = torch.where(newly, candidates, tokens)
            if watch:
                confidence = torch.where(committed, confidence, candidate_conf)
            committed |= newly
            if watch:
                steps.append(DenoiseStep(tuple(map(tuple, tokens.tolist())), tuple(map(tuple, confidence.tolist()))))
        return Drafts(tokens=tuple(map(tuple, tokens.tolist())), steps=tuple(steps))

    def tree_drafts(
        self,
        logits: torch.Tensor,  # (L, V') the last step's, of the one row
        tokens: torch.Tensor,  # (L,) the row's tokens (MASKED where not committed)
        committed: torch.Tensor,  # (L,) bool
        cfg: DecodeConfig,
        randomness: DraftRandomness,
        steps: list[DenoiseStep],  # the earlier steps, when watched
        watch: bool,
    ) -> Drafts:
        """Diversity "tree": the paths of the tree of K x L nodes that the last step's (L, V) logits expect to accept
        the most tokens (``best_first_paths``), each position's chances those of its draft token: the drafter's
        probabilities when greedy; when sampling, the softmax of the scores coupled to the target's coming draws
        (``choice_scores``), whose best is the coupled draft. Positions committed at earlier steps hold their token.
        The drafts are the tree's paths (up to K x L of them, up to L long); the last denoise step shows them."""
        chances = self.tree_chances(allowed_logits(logits, self.banned), cfg, randomness)
        if cfg.steps > 1:  # earlier steps committed positions (T = 1 commits none before the tree)
            one_hot = F.one_hot(tokens.clamp(min=0), chances.shape[-1]).to(chances.dtype)
            chances = torch.where(committed[:, None], one_hot, chances)
        budget = cfg.drafts * cfg.block
        tree = best_first_paths(*read_top(*chances.topk(min(budget, chances.shape[-1]), dim=-1)), budget)
        if watch:
            steps = [*steps, DenoiseStep(tree.tokens, tree.chances)]
        return Drafts(tree.tokens, tuple(steps), tree.order, chances=tree.chances)

    def tree_chances(self, allowed: torch.Tensor, cfg: DecodeConfig, randomness: DraftRandomness) -> torch.Tensor:
        """A tree node's chances (..., V) from its position's logits: greedy, the chance that a token is the target's
        most likely one, the drafter's distribution sharpened; sampling, the chance that the target's draw lands on
        it, the softmax of the coupled scores as they are (sharper trees lost there: held-out chats and stories at
        0.7, 32 nodes, 2.42 / 1.26 tokens a round at sharpness 1 against 2.24 / 1.07 at 1.5)."""
        if cfg.greedy:
            return (allowed * self.tree_sharpness).softmax(-1)
        return choice_scores(allowed, allowed, cfg, randomness.upcoming).softmax(-1)

    def choose_tokens(
        self,
        logits: torch.Tensor,
        cfg: DecodeConfig,
        step: int,
        randomness: DraftRandomness,
        ranked: bool = True,
        row_noise: torch.Tensor | None = None,
    ):
        """Best token and its probability per (draft, position), with the diversity strategy applied: the most likely
        token when greedy, the target-coupled one when sampling (``choice_scores``).

        ``logits`` (K, L, V), or (1, L, V) for K identical rows (the first step): the choice runs once and its rows are
        copied, so K drafts at T = 1 cost one draft's token choice too (the work ``draft_work`` declares).
        ``row_noise``: diversity "gumbel"'s (K, L, V) noise when the caller draws it (``row_gumbel``), else drawn here.
        Returns candidates (K, L), their confidence (K, L) and the (K, L) positions forced to commit now (branches).
        Without ``ranked`` (nobody reads the confidence) and with no branches or Gumbel rows to rank, the choice is
        the maximum of the logits themselves, where the softmax's is (the drafter's most likely token): no softmax
        over the vocabulary, and confidence and forced come back as None.
        """
        k = cfg.drafts
        allowed = allowed_logits(logits, self.banned)
        # One draft branches too (on its top token) when a later step follows: it is then the first of K branched
        # drafts whatever K, as ``engine.accepted_with_fewer`` assumes (unbranched, its step 1 commits positions by
        # confidence alone, and step 2 may fill the first position otherwise). At T = 1 that changes no token.
        branching = cfg.diversity.startswith("branch") and step == 1 and (k > 1 or cfg.steps > 1)
        gumbel_rows = cfg.diversity == "gumbel" and k > 1
        if not (ranked or branching or gumbel_rows):
            # The logits stand in for the probabilities (the same argmax); max's indices: a third faster than argmax's
            # on a CPU (the first maximum either way).
            return choice_scores(allowed, allowed, cfg, randomness.upcoming).max(-1).indices.expand(k, -1), None, None
        probs = allowed.softmax(-1)  # (K or 1, L, V)
        scores = choice_scores(allowed, probs, cfg, randomness.upcoming)
        if gumbel_rows:
            noise = row_noise if row_noise is not None else row_gumbel(cfg, probs.shape[1:], randomness, probs.device)
            # greedy: the argmax of p is the argmax of log p, which the noise needs
            scores = (probs.log() if randomness.upcoming is None else scores) + noise
            probs = probs.expand(k, -1, -1)
        candidates = scores.argmax(-1).expand(k, -1).clone()  # rows of their own: branches write into them
        conf = probs.gather(-1, candidates[: probs.shape[0], :, None])[..., 0].expand(k, -1).clone()
        forced = torch.zeros_like(candidates, dtype=torch.bool)
        if branching:
            # Step 1 sees identical rows ([root, MASK...]), so row 0 ranks the branch tokens for all drafts. The
            # position stays on the device (a (1,) index): the host never waits for it.
            first = torch.zeros(1, dtype=torch.long, device=conf.device)
            pos = first if cfg.diversity == "branch-first" else conf[0].argmin().view(1)
            at = probs[0].index_select(0, pos)[0]  # (V,)
            top = top_choices(scores[0].index_select(0, pos)[0], at, cfg.drafts)
            candidates.index_copy_(1, pos, top[:, None])
            conf.index_copy_(1, pos, at.gather(0, top)[:, None])
            forced.index_fill_(1, pos, True)
        return candidates, conf, forced

    def chooses_in_order(self, cfg: DecodeConfig) -> bool:
        """Whether the last step chooses each position's token given the one before it (``chain_tokens``)."""
        return False

    def chain_tokens(self, state, root, logits, tokens, fixed, cfg, randomness):
        """(K, L) tokens of the last step chosen left to right, each given the one before it (``fixed`` positions
        keep ``tokens``' own: committed earlier, or branch tokens), and (K, L, V) each position's scores given the
        chosen token before it."""
        raise NotImplementedError

    def chosen_in_order(self, state, root, logits, candidates, committed, forced, cfg, randomness, watch: bool):
        """The last step's (K, L) tokens by ``chain_tokens``, and their (K, L) confidence when watched (else None)."""
        fixed = committed if forced is None else committed | forced
        chosen = self.chain_tokens(state, root, logits, candidates, fixed, cfg, randomness)[0]
        if not watch:
            return chosen, None
        probs = allowed_logits(logits, self.banned).softmax(-1).expand(chosen.shape[0], -1, -1)
        return chosen, probs.gather(-1, chosen[..., None])[..., 0]

    @staticmethod
    def commit_schedule(conf, committed, forced, done: int, total: int, cfg: DecodeConfig) -> torch.Tensor:
        """(K, L) bool: positions to commit this step so that ``total`` are committed in each row (``done`` are)."""
        length = committed.shape[1]
        if total == length:  # the last step (the only one at T = 1) commits whatever is left, in any order
            return ~committed
        if cfg.schedule == "confidence":
            priority = conf
        else:  # left to right: earlier positions first
            priority = -torch.arange(length, device=conf.device, dtype=conf.dtype).expand_as(conf)
        priority = priority.masked_fill(forced, float("inf")).masked_fill(committed, float("-inf"))
        chosen = priority.topk(total - done, dim=1).indices
        newly = torch.zeros_like(committed)
        newly.scatter_(1, chosen, True)
        return newly & ~committed


def as_rows(x: torch.Tensor | None) -> tuple[tuple, ...]:
    """A (R, L) tensor as rows of Python numbers (what ``Drafts`` and ``DenoiseStep`` hold); () for None."""
    return () if x is None else tuple(map(tuple, x.tolist()))


def row_gumbel(cfg: DecodeConfig, shape: torch.Size, randomness: DraftRandomness, device) -> torch.Tensor | None:
    """Diversity "gumbel": (K, L, V) Gumbel noise per draft row from the drafter's generator; None otherwise."""
    if cfg.diversity != "gumbel" or cfg.drafts < 2:
        return None
    rng = randomness.generator
    return gumbel(torch.rand((cfg.drafts, *shape), generator=rng, device=rng.device).to(device))
