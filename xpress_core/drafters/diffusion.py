"""Our target-conditioned block-diffusion drafter: its context cache of target features and its block forward
(``TargetConditionedDrafter``), with two noise types: masked (``DiffusionDrafter``, the T-step masked refinement of
``masked.py``, and with a refiner head its refinement passes) and Gaussian (``GaussianDiffusionDrafter``);
``diffusion_drafter`` picks the sampler from the model's config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise

import torch

from ..config import TREE, DecodeConfig
from ..controller import RoundSetting
from ..counting import AUTO_PASSES
from ..sampling import noisy_logits
from ..trace import DenoiseStep, Refinement
from .base import (
    Drafter,
    DraftRandomness,
    Drafts,
    allowed_logits,
    banned_token_bias,
    choice_scores,
    read_top,
    refine_groups,
)
from .diffusion_model import ContextKV, KVSlots, XpressDrafter, add_noise, signal_share
from .masked import MaskedDiffusionDrafter, as_rows, row_gumbel, stacked
from .refiner import PASS_CANDIDATES, RefinementPasses, previous_tokens, reads_between_passes

# Context slots a drafter state holds beyond the prompt before it must grow (it then doubles): a reply of up to this
# many tokens never reallocates.
CONTEXT_HEADROOM = 512


@dataclass
class DiffusionState:
    """The committed context's keys/values in preallocated buffers: a commit writes its tokens' slots in place instead
    of concatenating a new tensor every round. Committed tokens wait as target features in ``pending`` until the next
    draft projects them all in one forward: a run of plain steps (the controller's L = 0) costs the drafter nothing."""

    buffers: ContextKV  # per drafter layer (1, kv_heads, capacity, head_dim); the first ``length`` slots are used
    length: int  # tokens whose keys/values are in the buffers
    previous: torch.Tensor  # (F,) tapped features of the last committed token, the one before the root
    pending: list[torch.Tensor] = field(default_factory=list)  # (m, F) tapped features of tokens committed since
    selector_hidden: torch.Tensor | None = None  # (R, L, H) the last block forward's final hidden states (DFlash 2)
    # (1, 1, P, D) ``Rotary``'s cos and signed sine of positions 0..P-1 in the drafter's dtype, P at least the buffers'
    # capacity: a block forward slices its positions' (``TargetConditionedDrafter.rotary_angles``)
    angles: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def committed(self) -> int:
        """Committed tokens in the context, pending ones included (= target cache length)."""
        return self.length + sum(f.shape[0] for f in self.pending)

    @property
    def context(self) -> ContextKV:
        """Per drafter layer (1, kv_heads, S, head_dim) keys/values of the committed context (views)."""
        return [(k[:, :, : self.length], v[:, :, : self.length]) for k, v in self.buffers]

    def reserve(self, count: int) -> None:
        """Room for ``count`` slots after the context: the buffers double when full."""
        end = self.length + count
        if end > self.buffers[0][0].shape[2]:
            self.buffers = [(grown(k, 2 * end), grown(v, 2 * end)) for k, v in self.buffers]

    def slots(self) -> list[KVSlots]:
        """Per layer, the buffers with the context in their first slots (the next slots free, ``reserve`` them)."""
        return [KVSlots(k, v, self.length) for k, v in self.buffers]

    def append(self, new: ContextKV) -> None:
        """Write new tokens' (1, kv_heads, m, head_dim) keys/values after the context."""
        self.reserve(new[0][0].shape[2])
        for slots, (nk, nv) in zip(self.slots(), new):
            slots.extend(nk, nv)
        self.length += new[0][0].shape[2]


def grown(buffer: torch.Tensor, capacity: int) -> torch.Tensor:
    """A (B, H, capacity, D) buffer holding ``buffer``'s slots first."""
    out = buffer.new_empty((*buffer.shape[:2], capacity, buffer.shape[3]))
    out[:, :, : buffer.shape[2]] = buffer
    return out


class TargetConditionedDrafter(Drafter):
    """The context cache of an ``XpressDrafter`` (fused target features as keys/values) and its block forward."""

    name = "diffusion"
    noise: str  # the model's noise type, one of config.NOISE_TYPES

    def __init__(self, model: XpressDrafter, banned_ids: list[int]):
        self.model = model
        self.device = model.device
        self.tapped_layers = tuple(model.config.tapped_layers)
        self.max_block = model.config.block_size
        self.banned = banned_token_bias(model.config.vocab_size, banned_ids, model.device)
        self.tree_sharpness = model.config.tree_sharpness

    @torch.no_grad()
    def start(self, prompt_ids, features):
        n = features.shape[0]
        positions = torch.arange(n, device=features.device)[None]
        context = self.model.context_kv(features[None], positions)
        capacity = n + CONTEXT_HEADROOM
        return DiffusionState([(grown(k, capacity), grown(v, capacity)) for k, v in context], n, features[-1])

    def commit(self, state: DiffusionState, tokens, features):
        state.pending.append(features)
        state.previous = features[-1]

    def context_length(self, state: DiffusionState) -> int:
        return state.committed

    @torch.no_grad()
    def project_pending(self, state: DiffusionState) -> None:
        """The pending tokens' context keys/values, in one forward, into the buffers."""
        if state.pending:
            features = torch.cat(state.pending)
            positions = torch.arange(state.length, state.length + features.shape[0], device=features.device)[None]
            state.pending = []
            state.append(self.model.context_kv(features[None], positions))

    def block_logits(self, state: DiffusionState, block_embeds: torch.Tensor) -> torch.Tensor:
        """One drafter forward on R blocks ``[root, L positions]`` (R, L+1, H) after the context -> (R, L, V). A
        drafter with a candidate selector (DFlash 2) keeps the hidden states for it (``chain_tokens``)."""
        hidden = self.block_hidden(state, block_embeds)
        if self.model.candidate_selector is not None:
            state.selector_hidden = hidden
        return self.model.head_logits(hidden)

    def block_hidden(self, state: DiffusionState, block_embeds: torch.Tensor) -> torch.Tensor:
        """One drafter forward on R blocks ``[root, L positions]`` (R, L+1, H) after the context -> (R, L, H) the
        hidden states that predict tokens 1..L (what the LM head reads, and the refiner).

        One block (every first denoise step) takes the pending tokens in through the same forward: their keys/values
        are projected in the block's own matrix products and written, with the block's, into the context buffers
        (``KVSlots``), so a draft runs no separate context forward and no concatenation. R different blocks attend to
        the context as it is, after it took the pending tokens in."""
        rows, span, _ = block_embeds.shape
        block_embeds = self.model.with_previous(block_embeds, state.previous[None, None])
        if rows > 1:
            self.project_pending(state)
            start, end = state.length, state.length + span
            positions = torch.arange(start, end, device=block_embeds.device).expand(rows, -1)
            context = [(ck.expand(rows, -1, -1, -1), cv.expand(rows, -1, -1, -1)) for ck, cv in state.context]
            angles = self.rotary_angles(state, start, end, block_embeds.dtype)
            return self.model.draft_hidden(block_embeds, positions, context, angles=angles)
        pending = self.model.fuse(torch.cat(state.pending))[None] if state.pending else None
        taken = 0 if pending is None else pending.shape[1]
        state.reserve(taken + span)
        start, end = state.length, state.length + taken + span
        positions = torch.arange(start, end, device=block_embeds.device)[None]
        angles = self.rotary_angles(state, start, end, block_embeds.dtype)
        hidden = self.model.draft_hidden(block_embeds, positions, state.slots(), pending, angles)
        state.pending, state.length = [], state.length + taken
        return hidden

    def rotary_angles(self, state: DiffusionState, start: int, end: int, dtype: torch.dtype) -> tuple:
        """``Rotary``'s cos and signed sine (1, 1, end - start, D) of positions start..end-1, sliced from the state's
        table (``DiffusionState.angles``), computed again only when the buffers outgrow it: a draft's own rotary costs
        about ten small ops, two slices here. The values are the same bit for bit (elementwise functions of the
        position)."""
        if state.angles is None or state.angles[0].shape[2] < end:
            positions = torch.arange(max(end, state.buffers[0][0].shape[2]), device=self.device)[None]
            state.angles = self.model.rotary(positions, dtype)
        cos, signed_sin = state.angles
        return cos[:, :, start:end], signed_sin[:, :, start:end]


class DiffusionDrafter(TargetConditionedDrafter, MaskedDiffusionDrafter):
    """The masked drafter (ours, or a DFlash checkpoint loaded into it): positions start as MASK and are committed by
    the schedule; the context cache comes from ``TargetConditionedDrafter``, the refinement from
    ``MaskedDiffusionDrafter``."""

    noise = "mask"

    def __init__(self, model: XpressDrafter, banned_ids: list[int]):
        super().__init__(model, banned_ids)
        # With a refiner head a round's T steps are its drafter forward and T - 1 refinement passes (refiner.py);
        # without one, T denoise steps.
        self.step_kind = "pass" if model.refiner is not None else "denoise"
        self.passes = RefinementPasses(model) if model.refiner is not None else None

    def draft_work(self, setting: RoundSetting) -> tuple[int, int]:
        """A refining drafter runs one forward over one row whatever T (its passes are ``refine_passes``)."""
        if self.step_kind == "pass":
            return 1, setting.block + 1
        return super().draft_work(setting)

    def refine_passes(self, setting: RoundSetting) -> int:
        return setting.steps - 1 if self.step_kind == "pass" and not setting.plain else 0

    @property
    def auto_steps(self) -> tuple[int, ...]:
        return AUTO_PASSES if self.step_kind == "pass" else super().auto_steps

    @property
    def pass_gains(self) -> dict[int, tuple[float, ...]]:
        gains = self.model.config.refiner_gains or []
        return {passes + 2: tuple(row) for passes, row in enumerate(gains)}

    @torch.no_grad()
    def draft(self, state, root: int, cfg: DecodeConfig, randomness: DraftRandomness, watch: bool) -> Drafts:
        if self.step_kind == "denoise" or cfg.steps == 1:  # one step: the drafter's forward alone, either way
            return super().draft(state, root, cfg, randomness, watch)
        return self.refined_draft(state, root, cfg, randomness, watch)

    def refined_draft(self, state, root: int, cfg: DecodeConfig, randomness: DraftRandomness, watch: bool) -> Drafts:
        """Pass 0: one drafter forward on ``[root, MASK x L]`` and its token choice (branches and all, as a one-step
        masked draft makes them). Passes 1..T-1: the K rows together, as one batch, through the refiner, each reading
        the tokens the pass before drafted (``refiner.py``); branch tokens stay. A pass that changes no token is a
        fixed point: the rest would change nothing (a CPU does not run them; a GPU does rather than wait to learn it). A draft tree is refined along its own paths
        instead (``refined_tree``)."""
        hidden = self.block_hidden(state, self.model.first_block(root, cfg.block))
        raw = self.model.raw_logits(hidden)
        first = logits = self.model.processed(raw).to(self.device)  # (1, L, V) pass 0
        allowed = allowed_logits(first[0], self.banned)
        # Best first: a greedy tree reads its first nodes from it (``refined_tree``). Sorting the 64 costs nothing
        # measurable; a second top-k over the vocabulary 0.03 plain steps.
        shortlist = allowed.topk(min(PASS_CANDIDATES, allowed.shape[-1])).indices  # (L, C)
        inputs = self.passes.inputs(hidden, raw, shortlist)
        if cfg.diversity == TREE:
            return self.refined_tree(allowed, inputs, root, cfg, randomness, watch)
        noise = row_gumbel(cfg, logits.shape[1:], randomness, self.device)
        tokens, confidence, forced = self.choose_tokens(logits, cfg, 1, randomness, watch, noise)
        forced = torch.zeros_like(tokens, dtype=torch.bool) if forced is None else forced
        before = tokens  # pass 0's draft, kept for ``Refinement`` whether watched or not
        steps = [DenoiseStep(as_rows(before), as_rows(confidence), kind="pass")] if watch else []
        roots = torch.full((cfg.drafts,), root, device=self.device)
        # Every pass computes positions 1.. (the first has no correction: pass 0's token stays), so that no pass waits
        # for the host to learn where the one before changed a token; one that changes none is a fixed point, which
        # a CPU stops at (a read costs nothing there) and a GPU runs through (the same tokens again, no wait).
        stop_at_fixed_point = watch or reads_between_passes(self.device)
        for _ in range(cfg.steps - 1):
            previous = previous_tokens(roots, tokens)  # (K, L): each position's token one earlier
            # Parallel refinement: the K rows in one pass; serial: a pass per row (the comparison; same drafts).
            logits = stacked([self.passes.logits(inputs, previous[g], 1) for g in refine_groups(cfg)])
            chosen, chosen_confidence = self.choose_among(
                logits.to(self.device), inputs.candidates[1:], cfg, randomness, watch, noise, 1
            )
            candidates = tokens.clone()
            candidates[:, 1:] = torch.where(forced[:, 1:], tokens[:, 1:], chosen)
            fixed_point = stop_at_fixed_point and torch.equal(candidates, tokens)  # the pass's one read, if any
            tokens = candidates
            if watch:
                confidence = confidence.clone()
                confidence[:, 1:] = chosen_confidence
                steps.append(DenoiseStep(as_rows(tokens), as_rows(confidence), kind="pass"))
            if fixed_point:
                break  # the next passes would change nothing
        before, after = (tuple(map(tuple, rows)) for rows in torch.stack([before, tokens]).tolist())  # one read
        return Drafts(tokens=after, steps=tuple(steps), refinement=Refinement(before, after))

    def choose_among(self, logits, candidates, cfg: DecodeConfig, randomness, watch: bool, row_noise, start: int):
        """A pass's tokens (K, S) at positions ``start``.. from the (K, S, C) logits of their (S, C) candidates, chosen
        as ``choose_tokens`` chooses over the vocabulary, and their confidence (K, S) when watched (the candidates'
        softmax: they hold nearly all of pass 0's mass), else None."""
        upcoming = randomness.upcoming
        upcoming = None if upcoming is None else upcoming[start:].to(self.device).gather(-1, candidates)
        scores = choice_scores(logits, logits, cfg, upcoming)  # greedy: the best logit is the best probability
        if row_noise is not None:  # diversity "gumbel": each row's own noise (greedy: on the log-probabilities)
            noise = row_noise[:, start:].gather(-1, candidates.expand(cfg.drafts, -1, -1))
            scores = (logits.log_softmax(-1) if upcoming is None else scores) + noise
        best = scores.argmax(-1, keepdim=True)
        tokens = candidates.expand(cfg.drafts, -1, -1).gather(-1, best)[..., 0]
        return tokens, logits.softmax(-1).gather(-1, best)[..., 0] if watch else None

    def refined_tree(self, allowed, inputs, root: int, cfg: DecodeConfig, randomness, watch: bool) -> Drafts:
        """The draft tree of K x L nodes refined along its own paths (``RefinementPasses.refined_trees``): pass 0's
        tree from the block's (L, V') ``allowed`` logits as at T = 1, then every node's children scored given its own
        path, chances read as ``tree_chances`` reads the marginals (the candidates' softmax, sharpened when greedy,
        the coupled scores' when sampling). Measured against the T = 1 tree with the refined chain grafted on: lab
        log, "A draft tree refined along its own paths"."""
        budget = cfg.drafts * cfg.block
        candidates = inputs.candidates.to(self.device)
        marginals = self.tree_chances(allowed, cfg, randomness)
        if cfg.greedy and budget <= candidates.shape[-1]:
            # Greedy chances rise with the logits: the candidates, best first, are each position's best tokens in
            # the order a top-k of the chances gives.
            best = candidates[:, :budget]
            first = (marginals.gather(-1, best), best)
        else:
            first = marginals.topk(min(budget, allowed.shape[-1]), dim=-1)
        banned = self.banned[candidates]  # a vocabulary smaller than the candidates' count makes banned ones candidates
        upcoming = None if randomness.upcoming is None else randomness.upcoming.to(self.device).gather(-1, candidates)

        def chances(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:  # (S, C) at (S,) positions
            coupled = DraftRandomness(randomness.generator, None if upcoming is None else upcoming[positions])
            return self.tree_chances(logits.to(self.device) + banned[positions], cfg, coupled)

        if reads_between_passes(self.device):  # the host builds each tree, and scores only nodes not scored yet
            trees = self.passes.refined_trees(inputs, root, read_top(*first), chances, budget, cfg.steps - 1)
        else:  # a GPU builds them, and the host reads them once
            trees = self.passes.refined_trees_on_device(inputs, root, tuple(first), chances, budget, cfg.steps - 1)
        # Each tree a step of the panel ("tree": its rows are paths, not the rows of the tree before)
        steps = tuple(DenoiseStep(t.tokens, t.chances, kind="tree") for t in trees) if watch else ()
        tree = trees[-1]
        return Drafts(tree.tokens, steps, tree.order, Refinement(trees[0].tokens, tree.tokens), tree.chances)

    def first_denoise(
        self, state: DiffusionState, root: int, tokens: torch.Tensor, committed: torch.Tensor
    ) -> torch.Tensor:
        """The first step's block from the root's row and the mask's (``XpressDrafter.first_block``)."""
        return self.block_logits(state, self.model.first_block(root, tokens.shape[1]))

    def denoise(self, state: DiffusionState, root: int, tokens: torch.Tensor, committed: torch.Tensor) -> torch.Tensor:
        """One drafter forward on the rows' blocks ``[root, tokens or MASK]`` -> (R, L, V) logits."""
        rows = tokens.shape[0]
        block = torch.cat([torch.full((rows, 1), root, device=tokens.device), tokens], dim=1)
        masked = torch.cat([torch.zeros((rows, 1), dtype=torch.bool, device=tokens.device), ~committed], dim=1)
        return self.block_logits(state, self.model.embed_block(block, masked))

    def chooses_in_order(self, cfg: DecodeConfig) -> bool:
        # Gumbel rows differ by their own noise only; one selector walk would make them all alike.
        return self.model.candidate_selector is not None and not (cfg.diversity == "gumbel" and cfg.drafts > 1)

    def chain_tokens(self, state, root, logits, tokens, fixed, cfg, randomness):
        """DFlash 2's selection: each position's top ``selector_top_k`` tokens by logit (the reference's candidates,
        banned ones then scored -inf), rescored given the token before it (``XpressDrafter.conditional_scores``); the
        best is the draft when greedy, the one coupled to the target's draw there when sampling. The scores, as
        (K, L, V) logits (-inf outside the candidates), are what a draft tree reads."""
        k, length = tokens.shape
        hidden = state.selector_hidden.expand(k, -1, -1)  # (K, L, H)
        logits = logits.expand(k, -1, -1)
        unary, candidates = torch.topk(logits, self.model.candidate_selector.top_k, dim=-1, sorted=False)
        unary = unary.float() + self.banned[candidates]
        previous = torch.full((k,), root, device=tokens.device)
        chosen = tokens.clone()
        conditional = torch.full((k, length, logits.shape[-1]), float("-inf"), device=logits.device)
        for position in range(length):
            at = candidates[:, position]
            scores = self.model.conditional_scores(hidden[:, position], previous, at, unary[:, position]).float()
            conditional[:, position] = conditional[:, position].scatter(-1, at, scores)
            if randomness.upcoming is not None:  # the candidates' scores as a distribution, with the target's noise
                scores = noisy_logits(conditional[:, position], cfg, randomness.upcoming[position]).gather(-1, at)
            best = at.gather(-1, scores.argmax(-1, keepdim=True))[:, 0]
            chosen[:, position] = torch.where(fixed[:, position], tokens[:, position], best)
            previous = chosen[:, position]
        return chosen, conditional


class GaussianDiffusionDrafter(TargetConditionedDrafter):
    """The continuous drafter (the seed article's variant): K blocks of pure Gaussian noise in the (unit-RMS) token
    embedding space, denoised by T DDIM steps (Song et al. 2021, eta = 0) from t = 1 to t = 0.

    Each step: one drafter forward (all K rows at once in parallel refinement) predicts the clean tokens' logits;
    the nearest token at every position (the LM head's argmax; when sampling, the token coupled to the target's draw,
    ``choice_scores``) and its embedding are the clean estimate x0_hat, and
    the block moves to the next noise level along the same noise direction. Snapping x0_hat to a token embedding
    (the "clamping trick" of Diffusion-LM, Li et al. 2022) keeps every step's input on the training distribution
    (noised embeddings of real tokens); a probability-weighted mean embedding would be a blur the drafter never saw.
    The last step's tokens are the drafts. The K drafts differ only through their independent starting noise, drawn
    from the drafter's seeded generator, so the same seed gives the same drafts; the schedule and diversity
    settings of the masked drafter do not apply.
    """

    noise = "gaussian"

    @torch.no_grad()
    def draft(
        self, state: DiffusionState, root: int, cfg: DecodeConfig, randomness: DraftRandomness, watch: bool
    ) -> Drafts:
        shape = (cfg.drafts, cfg.block, self.model.config.hidden_size)
        device = self.model.device
        rng = randomness.generator
        x = torch.randn(shape, generator=rng, device=rng.device).to(device, self.model.dtype)  # x_1
        levels = noise_levels(cfg.steps)
        root_embed = self.model.token_embeddings(torch.full((1, 1), root, device=device))  # (1, 1, H), clean
        # The K rows differ from the first step, which serial refinement runs one row at a time: the pending tokens
        # go in first, by themselves, so that both layouts compute them alike and make the same drafts.
        self.project_pending(state)
        steps = []
        for t, t_next in pairwise(levels):
            logits = stacked([self.denoise(state, root_embed, x[rows], t) for rows in refine_groups(cfg)])
            allowed = allowed_logits(logits, self.banned)
            probs = allowed.softmax(-1)  # (K, L, V)
            tokens = choice_scores(allowed, probs, cfg, randomness.upcoming).argmax(-1)
            conf = probs.gather(-1, tokens[..., None])[..., 0]
            x = ddim_step(x, self.model.token_embeddings(tokens), t, t_next)
            if watch:
                steps.append(DenoiseStep(tuple(map(tuple, tokens.tolist())), tuple(map(tuple, conf.tolist())), t))
        return Drafts(tokens=tuple(map(tuple, tokens.tolist())), steps=tuple(steps))

    def denoise(self, state: DiffusionState, root_embed: torch.Tensor, x: torch.Tensor, t: float) -> torch.Tensor:
        """One drafter forward on the rows' blocks ``[root, x_t]`` (x: (R, L, H)) -> (R, L, V) logits."""
        rows, length, _ = x.shape
        block = torch.cat([root_embed.expand(rows, -1, -1), x], dim=1)
        levels = torch.full((rows, length + 1), t, device=x.device)
        levels[:, 0] = 0.0  # the root is given clean
        return self.block_logits(state, self.model.embed_noisy_block(block, levels))


def noise_levels(steps: int) -> list[float]:
    """T + 1 evenly spaced noise levels from pure noise to clean: T = 2 -> [1.0, 0.5, 0.0]."""
    return [1.0 - s / steps for s in range(steps + 1)]


def ddim_step(x: torch.Tensor, clean: torch.Tensor, t: float, t_next: float) -> torch.Tensor:
    """Deterministic DDIM update (eta = 0) from level t to t_next given the clean estimate: the noise implied by
    x_t and x0_hat, eps_hat = (x_t - sqrt(a_t) x0_hat) / sqrt(1 - a_t), is kept and rescaled to level t_next."""
    a = float(signal_share(torch.tensor(t)))
    eps = (x - math.sqrt(a) * clean) / math.sqrt(1.0 - a)  # t > 0 at every step, so 1 - a > 0
    return add_noise(clean, eps, torch.full(x.shape[:-1], t_next, device=x.device))


def diffusion_drafter(model: XpressDrafter, banned_ids: list[int]) -> TargetConditionedDrafter:
    """The sampler for the drafter's noise type (its config says which)."""
    sampler = GaussianDiffusionDrafter if model.config.noise == "gaussian" else DiffusionDrafter
    return sampler(model, banned_ids)
