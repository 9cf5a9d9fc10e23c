"""Drafter quality for the model cards: mean accepted length tau on held-out chats, and tokens/s against plain.

tau counts the tokens a drafting round emits: the accepted draft tokens plus the target's own (so tau = 1 means
nothing was accepted). Pooled over all rounds of all prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..config import DecodeConfig
from ..drafters.base import NoDrafter
from ..engine import Models, decode
from ..trace import DecodeResult

# (K, T, L) the issue asks the cards to report.
CARD_SETTINGS = ((1, 1, 8), (4, 2, 8), (4, 4, 16))
AR_DRAFT_LENGTHS = (2, 3, 4, 6, 8)


@dataclass(frozen=True)
class DrafterScore:
    drafts: int
    steps: int
    block: int
    tau: float
    tokens_per_s: float
    plain_tokens_per_s: float
    prompts: int

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.plain_tokens_per_s


def run_all(models: Models, prompt_ids: list, cfg: DecodeConfig) -> list[DecodeResult]:
    return [list(decode(models, ids, cfg))[-1] for ids in prompt_ids]


def score(models: Models, prompt_ids: list, cfg: DecodeConfig, plain_tps: float) -> DrafterScore:
    results = run_all(models, prompt_ids, cfg)
    rounds = sum(r.rounds for r in results)
    emitted = sum(sum(r.accept_lens) + r.rounds for r in results)
    tps = sum(r.new_tokens for r in results) / sum(r.time_s for r in results)
    return DrafterScore(cfg.drafts, cfg.steps, cfg.block, emitted / max(rounds, 1), tps, plain_tps, len(results))


def evaluate(models: Models, prompt_ids: list, settings, max_new_tokens: int = 64) -> list[DrafterScore]:
    plain = Models(models.target, models.tokenizer, NoDrafter())
    warm = DecodeConfig(max_new_tokens=8)
    run_all(plain, prompt_ids[:2], warm)  # first calls pay one-off allocation costs
    plain_results = run_all(plain, prompt_ids, DecodeConfig(max_new_tokens=max_new_tokens))
    plain_tps = sum(r.new_tokens for r in plain_results) / sum(r.time_s for r in plain_results)
    return [
        score(
            models, prompt_ids, DecodeConfig(drafts=k, steps=t, block=length, max_new_tokens=max_new_tokens), plain_tps
        )
        for k, t, length in tqdm(settings, desc="evaluate")
    ]


def heldout_prompt_ids(tokenizer, data_dir: Path, count: int = 50) -> list:
    from ..bench import default_prompts

    return [p.ids(tokenizer) for p in default_prompts(data_dir, sgd=count, stories=0)]
