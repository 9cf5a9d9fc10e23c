"""Which of two drafters drafts better, and by how much beyond chance: ``train compare``.

``train eval`` decodes 50 held-out chats, so each setting's τ rests on a few hundred rounds, and two drafters' τ
differ by 0.02-0.05 from which prompts happened to be drawn (lab log, "A draft tree refined along its own paths": a
pair the card's chats put 0.04 apart were within 1.3 standard errors on 250 chats). Here every position of the
target's greedy reply is a round's start (``sharpness.round_starts``, as the sharpness fit reads them), each drafter
drafts there at each setting, and the draft tokens the reply accepts are counted: many more rounds per prompt, the
same ones for every drafter. The difference of each drafter from the first comes with its standard error, bootstrapped
over prompts (a prompt's rounds are not independent of each other).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..config import DecodeConfig
from ..drafters.base import DraftRandomness
from ..models import Models
from ..tree import common_prefix
from .sharpness import greedy_reply, round_starts

BOOTSTRAP_ROUNDS = 1000


@dataclass(frozen=True)
class SettingComparison:
    setting: tuple[int, int, int]  # (K, T, L)
    accepted: tuple[float, ...]  # per drafter: draft tokens accepted per round start
    difference: tuple[float, ...]  # per drafter: its accepted minus the first drafter's (0 for the first)
    standard_error: tuple[float, ...]  # of each difference, over prompts resampled (0 for the first)


@torch.no_grad()
def accepted_at_starts(
    drafters: Sequence[Models], prompt_ids: torch.Tensor, settings: Sequence[tuple[int, int, int]], starts: int
) -> list[list[list[int]]]:
    """Per drafter, per setting, per round start (the first ``starts`` positions of the target's greedy reply to one
    prompt): the draft tokens the reply accepts from the drafter's greedy drafts (the engine's default diversity)."""
    block = max(length for _, _, length in settings)
    sequence = greedy_reply(drafters[0], prompt_ids, starts + block)
    counts = []
    for models in drafters:
        per_setting: list[list[int]] = [[] for _ in settings]
        for state, root, continuation in round_starts(models, sequence, prompt_ids.shape[1], starts, block):
            for accepted, (k, t, length) in zip(per_setting, settings):
                cfg = DecodeConfig(drafts=k, steps=t, block=length)
                drafts = models.drafter.draft(state, root, cfg, DraftRandomness(torch.Generator()), False)
                accepted.append(max(common_prefix(path, continuation[:length]) for path in drafts.tokens))
        counts.append(per_setting)
    return counts


def accepted_per_prompt(
    drafters: Sequence[Models], prompt_ids: torch.Tensor, settings: Sequence[tuple[int, int, int]], starts: int
) -> list[list[tuple[int, int]]]:
    """Per drafter, per setting: (draft tokens accepted, round starts) over one prompt's starts (``accepted_at_starts``)."""
    counts = accepted_at_starts(drafters, prompt_ids, settings, starts)
    return [[(sum(accepted), len(accepted)) for accepted in per_setting] for per_setting in counts]


def paired_difference(
    first: Sequence[tuple[int, int]], other: Sequence[tuple[int, int]], rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0
) -> tuple[float, float]:
    """``other``'s accepted per round start minus ``first``'s, from per-prompt (accepted, starts) pairs over the same
    prompts, and its standard error: the spread of the difference over ``rounds`` resamplings of the prompts."""
    a, b = torch.tensor(first, dtype=torch.float64), torch.tensor(other, dtype=torch.float64)

    def difference(rows: torch.Tensor) -> torch.Tensor:  # (..., prompts) indices -> (...,) differences
        return b[rows, 0].sum(-1) / b[rows, 1].sum(-1) - a[rows, 0].sum(-1) / a[rows, 1].sum(-1)

    every = torch.arange(len(a))
    resampled = torch.randint(0, len(a), (rounds, len(a)), generator=torch.Generator().manual_seed(seed))
    return float(difference(every)), float(difference(resampled).std())


def compare_drafters(
    drafters: Sequence[Models], prompts: Sequence[torch.Tensor], settings: Sequence[tuple[int, int, int]], starts: int
) -> list[SettingComparison]:
    """Every drafter at every setting on the same round starts, each against the first."""
    per_prompt = [accepted_per_prompt(drafters, ids, settings, starts) for ids in prompts]
    comparisons = []
    for s, setting in enumerate(settings):
        rows = [[prompt[d][s] for prompt in per_prompt] for d in range(len(drafters))]
        accepted = tuple(sum(a for a, _ in r) / max(1, sum(n for _, n in r)) for r in rows)
        paired = [(0.0, 0.0)] + [paired_difference(rows[0], r) for r in rows[1:]]
        comparisons.append(
            SettingComparison(setting, accepted, tuple(d for d, _ in paired), tuple(e for _, e in paired))
        )
    return comparisons
