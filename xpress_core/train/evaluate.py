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
from ..engine import Models, decode_to_end
from ..trace import DecodeResult, tokens_per_round

# (K, T, L) the issue asks the cards to report.
CARD_SETTINGS = ((1, 1, 8), (4, 2, 8), (4, 4, 16))
AR_DRAFT_LENGTHS = (2, 3, 4, 6, 8)


@dataclass(frozen=True)
class DrafterScore:
    drafts: int
    steps: int
    block: int
    tau: float
    draft_ms_per_round: float  # the drafter's own time per drafting round (the engine's draft timer)
    tokens_per_s: float
    plain_tokens_per_s: float
    prompts: int

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.plain_tokens_per_s


def run_all(models: Models, prompt_ids: list, cfg: DecodeConfig) -> list[DecodeResult]:
    return [decode_to_end(models, ids, cfg) for ids in prompt_ids]


def summarize(results: list[DecodeResult], cfg: DecodeConfig, plain_tps: float) -> DrafterScore:
    rounds = [a for r in results for a in r.accept_lens]
    tps = sum(r.new_tokens for r in results) / sum(r.time_s for r in results)
    draft_ms = 1000 * sum(r.draft_s for r in results) / max(len(rounds), 1)
    return DrafterScore(
        cfg.drafts, cfg.steps, cfg.block, tokens_per_round(rounds), draft_ms, tps, plain_tps, len(results)
    )


def evaluate(
    drafters: dict[str, Models], prompt_ids: list, settings, max_new_tokens: int = 64
) -> dict[str, list[DrafterScore]]:
    """Scores of each drafter (all on one target) at each (K, T, L) setting.

    Prompt by prompt the drafters take turns, so when several are compared on a shared machine its drift hits them
    alike and their drafting times stay comparable.
    """
    first = next(iter(drafters.values()))
    plain = Models(first.target, first.tokenizer, NoDrafter())
    warm = DecodeConfig(max_new_tokens=8)
    run_all(plain, prompt_ids[:2], warm)  # first calls pay one-off allocation costs
    plain_results = run_all(plain, prompt_ids, DecodeConfig(max_new_tokens=max_new_tokens))
    plain_tps = sum(r.new_tokens for r in plain_results) / sum(r.time_s for r in plain_results)
    scores: dict[str, list[DrafterScore]] = {name: [] for name in drafters}
    for k, t, length in tqdm(settings, desc="evaluate"):
        cfg = DecodeConfig(drafts=k, steps=t, block=length, max_new_tokens=max_new_tokens)
        results: dict[str, list[DecodeResult]] = {name: [] for name in drafters}
        for ids in prompt_ids:
            for name, models in drafters.items():
                results[name].append(decode_to_end(models, ids, cfg))
        for name in drafters:
            scores[name].append(summarize(results[name], cfg, plain_tps))
    return scores


def heldout_prompt_ids(tokenizer, data_dir: Path, count: int = 50) -> list:
    from ..bench import default_prompts

    return [p.ids(tokenizer) for p in default_prompts(data_dir, sgd=count, stories=0)]
