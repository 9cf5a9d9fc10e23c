"""The drafter interface every drafter implements, and helpers they share.

A drafter object holds read-only models and may serve many requests at once; all per-request state (caches) lives in
the state object that ``start`` returns.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cache

import torch

from ..config import DecodeConfig
from ..controller import RoundSetting, denoise_work
from ..counting import AUTO_STEPS
from ..errors import XpressError
from ..sampling import noisy_logits
from ..trace import DenoiseStep, Refinement


@dataclass(frozen=True)
class DraftRandomness:
    """The randomness a draft may use."""

    generator: torch.Generator  # the drafter's own, seeded per request (Gumbel diversity, the gaussian's start)
    upcoming: torch.Tensor | None = None  # sampling: the (L, V) noise of the target's next L draws (choice_scores)


@dataclass(frozen=True)
class Drafts:
    tokens: tuple[tuple[int, ...], ...]  # (K, L) final drafts, or a tree's paths; empty for the "none" drafter
    steps: tuple[DenoiseStep, ...] = ()  # per denoise step, for the visualizer: only when someone watches
    # A tree's drafts (diversity "tree"): per token, its place in the order the drafter chose the tree's nodes (at
    # T = 1 the tree of K' x L nodes is the first K' x L: ``accepted_with_fewer``); empty for K separate drafts.
    order: tuple[tuple[int, ...], ...] = ()
    refinement: Refinement | None = None  # what the refinement passes did, when any ran (watched or not)
    # A tree's drafts: per token, its own chance given the path before it, as the tree was built on them (the
    # visualizer's); empty for K separate drafts.
    chances: tuple[tuple[float, ...], ...] = ()


class Drafter(ABC):
    name: str = "drafter"
    # Target layers (0-based decoder layer outputs) whose hidden states ``commit`` needs; empty = none.
    tapped_layers: tuple[int, ...] = ()
    # The longest block L it can draft (a diffusion drafter's trained block size); None = any length.
    max_block: int | None = None
    # What sets that limit, for the error message.
    max_block_reason: str = "trained block size"
    # What a round's T steps are: "denoise" steps, or refinement "pass"es (a drafter with a refiner head).
    step_kind: str = "denoise"
    # Whether its draft trees (diversity "tree") are built best first on their nodes' chances (``Drafts.chances``), the
    # tree of k x L nodes the first k x L of a wider one: auto then runs a setting chosen at load on the trees' measured
    # acceptance (``engine.chosen_setting``).
    offers_chances: bool = False

    @property
    def auto_steps(self) -> tuple[int, ...]:
        """The T ``auto`` may pick for this drafter."""
        return AUTO_STEPS

    @property
    def pass_gains(self) -> dict[int, tuple[float, ...]]:
        """Per T > 1 and block position, acceptance after T - 1 refinement passes over acceptance after none, as
        measured on held-out text when the drafter was trained (the controller's prior); empty = not measured."""
        return {}

    def refine_passes(self, setting: RoundSetting) -> int:
        """Refinement passes a round at (K, T, L) runs beyond ``draft_work`` (priced apart: ``CostModel.pass_s``)."""
        return 0

    def draft_work(self, setting: RoundSetting) -> tuple[int, int]:
        """Forwards a draft at (K, T, L) runs and the positions they compute in all: what ``auto`` prices
        (docs/DESIGN.md §2.6)."""
        return denoise_work(setting)

    def check_block(self, cfg: DecodeConfig) -> None:
        """Refuse a block L beyond ``max_block`` (the engine asks once per request, before the prefill)."""
        if self.max_block is not None and cfg.block > self.max_block:
            raise XpressError(f"block L={cfg.block} exceeds the drafter's {self.max_block_reason} {self.max_block}")

    @abstractmethod
    def start(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> object:
        """Per-request state for a prompt (1, n) whose tokens are all in the target cache; features (n, F) or None."""

    @abstractmethod
    def draft(self, state: object, root: int, cfg: DecodeConfig, randomness: DraftRandomness, watch: bool) -> Drafts:
        """K drafts of L tokens continuing the committed tokens and ``root``; ``watch``: with the denoise steps."""

    @abstractmethod
    def commit(self, state: object, tokens: list[int], features: torch.Tensor | None) -> None:
        """Tokens that just entered the target cache (the old root and the accepted ones), with their features."""

    @abstractmethod
    def context_length(self, state: object) -> int:
        """Tokens the drafter's context holds (equals the target cache length between rounds)."""


class NoDrafter(Drafter):
    """Plain autoregressive decoding through the same engine: every round verifies only the root."""

    name = "none"

    def start(self, prompt_ids, features):
        return {"length": prompt_ids.shape[1]}

    def draft(self, state, root, cfg, randomness, watch):
        return Drafts(tokens=())

    def commit(self, state, tokens, features):
        state["length"] += len(tokens)

    def context_length(self, state):
        return state["length"]


@cache
def _forward_takes(cls: type, name: str) -> bool:
    return name in inspect.signature(cls.forward).parameters


def forward_takes(model: torch.nn.Module, name: str) -> bool:
    """Whether the model's forward takes the keyword ``name`` (a remote-code model may lack transformers' newer ones,
    such as ``logits_to_keep``)."""
    return _forward_takes(type(model), name)


def logits_kept(model: torch.nn.Module, count: int) -> dict:
    """The forward keywords that compute the LM head over the last ``count`` positions only, where the model takes
    them (else none: the caller slices the logits)."""
    return {"logits_to_keep": count} if forward_takes(model, "logits_to_keep") else {}


def allowed_logits(logits: torch.Tensor, banned: torch.Tensor) -> torch.Tensor:
    """fp32 logits over the drafter vocabulary (the first ``len(banned)`` ids) with the banned tokens at -inf.
    ``banned`` is additive (``banned_token_bias``): one addition casts and masks, a fifth of a cast and a fill."""
    return logits[..., : banned.shape[0]] + banned


def choice_scores(
    allowed: torch.Tensor, probs: torch.Tensor, cfg: DecodeConfig, upcoming: torch.Tensor | None
) -> torch.Tensor:
    """Scores whose argmax is the draft token at each position (..., V): the drafter's probabilities when greedy; when
    sampling, its processed logits plus the noise of the target's own draw there (``upcoming``, broadcast over the
    leading axes), so the draft is the token the target will draw wherever the two distributions are close (Gumbel
    coupling, sampling.py), not only where the target's draw happens to be the drafter's most likely token."""
    return probs if upcoming is None else noisy_logits(allowed, cfg, upcoming)


def top_choices(scores: torch.Tensor, probs: torch.Tensor, k: int) -> torch.Tensor:
    """The k best tokens of one position's (V,) ``choice_scores``; tokens the sampler never draws (-inf after top-k or
    top-p) come after all others, by the drafter's probability, and banned ones last."""
    finite = scores.isfinite()
    # Computed whether or not a score is infinite: asking would make the host wait for the device.
    lowest = scores.masked_fill(~finite, float("inf")).min()
    return torch.where(finite, scores, lowest - 1.0 + probs.log()).topk(k).indices


def read_top(values: torch.Tensor, indices: torch.Tensor) -> tuple[list[list[float]], list[list[int]]]:
    """A top-k's (S, k) values and token ids as Python lists: a draft tree is built on the host from them. From a GPU
    in one transfer (the ids exact in float64, then made ints); on a CPU each as it is (``one_transfer``)."""
    if not one_transfer(values.device):
        return values.tolist(), indices.tolist()
    values, indices = torch.stack([values.double(), indices.double()]).tolist()
    return values, [[int(t) for t in row] for row in indices]


def one_transfer(device: torch.device) -> bool:
    """Whether ``read_top`` reads its two tensors in one transfer: on a GPU each read waits for the device; on a CPU a
    read costs nothing, and the ids read as ints need no conversion (8 x 32 of a (4, 1, 8) tree's: 31 us against 8,
    one thread)."""
    return device.type != "cpu"


def refine_groups(cfg: DecodeConfig) -> list[slice]:
    """Which draft rows share a drafter forward: all K at once (parallel refinement) or one by one (serial). Slices,
    so that taking a group's rows is a view (a list of rows would be an index sent to the device)."""
    if cfg.refine == "parallel":
        return [slice(0, cfg.drafts)]
    return [slice(k, k + 1) for k in range(cfg.drafts)]


def banned_token_bias(vocab_size: int, banned_ids: list[int], device) -> torch.Tensor:
    """(V,) fp32, -inf at tokens a draft may never contain (mask, pad, bos, ... but not the end-of-turn tokens), 0
    elsewhere: added to a drafter's logits (``allowed_logits``)."""
    bias = torch.zeros(vocab_size, dtype=torch.float32, device=device)
    ids = [i for i in banned_ids if 0 <= i < vocab_size]
    if ids:
        bias[ids] = float("-inf")
    return bias
