"""Drafter quality for the model cards: mean accepted length tau on held-out chats, and tokens/s against plain.

tau counts the tokens a drafting round emits: the accepted draft tokens plus the target's own (so tau = 1 means
nothing was accepted). Pooled over all rounds of all prompts. Measured by the benchmark's own code
(``bench.measure``): the same timed calls, warm-up and interleaving as ``python -m xpress_core bench``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..bench.measure import BenchRun, RunPlan
from ..bench.methods import XPRESS, XPRESS_NONE, BenchModels, Setting
from ..bench.stages import run_stage
from ..config import DecodeConfig
from ..data import Prompt, default_prompts
from ..engine import decode_to_end
from ..models import Models
from ..trace import tokens_per_round

# (K, T, L) the model cards report: one draft at T = 1 to 4 and the default draft tree (K = 4, L = 8) at T = 1 to 3
# (T - 1 refinement passes for a drafter with a refiner head, T denoise steps without): tau per T; L = 4 was the
# fastest fixed block on this CPU before draft trees.
CARD_SETTINGS = ((1, 1, 4), (1, 1, 8), (1, 2, 8), (1, 3, 8), (1, 4, 8), (4, 1, 8), (4, 2, 8), (4, 3, 8))
AR_DRAFT_LENGTHS = (2, 3, 4, 6, 8)


@dataclass(frozen=True)
class DrafterScore:
    drafts: int
    steps: int
    block: int
    temperature: float
    tau: float
    draft_ms_per_round: float  # the drafter's own time per drafting round (the engine's draft timer)
    tokens_per_s: float
    plain_tokens_per_s: float
    prompts: int

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.plain_tokens_per_s


def eval_plan(drafters: Sequence[str], settings, max_new_tokens: int, temperatures=(0.0,)) -> RunPlan:
    """Plain decoding (the engine without a drafter), then every drafter at every (K, T, L), at each temperature,
    once."""
    xpress = tuple(
        Setting(XPRESS, decode=DecodeConfig(drafts=k, steps=t, block=length), drafter=name)
        for k, t, length in settings
        for name in drafters
    )
    return RunPlan(
        (Setting(XPRESS_NONE),) + xpress, temperatures=tuple(temperatures), max_new_tokens=max_new_tokens, repeats=1
    )


def drafter_scores(run: BenchRun, prompts: int) -> dict[str, list[DrafterScore]]:
    """Each drafter's scores, in the order its settings were planned, from the run's summaries."""
    plain = {s.temperature: s.tokens_per_s for s in run.summaries if s.setting.method == XPRESS_NONE}
    scores: dict[str, list[DrafterScore]] = {}
    for s in run.summaries:
        if s.setting.method == XPRESS:
            d = s.setting.decode
            score = DrafterScore(
                d.drafts,
                d.steps,
                d.block,
                s.temperature,
                s.tau,
                s.draft_ms_per_round,
                s.tokens_per_s,
                plain[s.temperature],
                prompts,
            )
            scores.setdefault(s.setting.drafter, []).append(score)
    return scores


def evaluate_run(
    drafters: dict[str, Models], prompts: Sequence[Prompt], settings, max_new_tokens: int = 64, temperatures=(0.0,)
) -> BenchRun:
    """The measurement behind ``evaluate``: every drafter (all on one target) at each (K, T, L) setting.

    Prompt by prompt the drafters take turns (in a shuffled order), so when several are compared on a shared machine
    its drift hits them alike and their drafting times stay comparable.
    """
    first = next(iter(drafters.values()))
    models = BenchModels(first.target, first.tokenizer, drafters={name: m.drafter for name, m in drafters.items()})
    return run_stage(
        "evaluate", models, prompts, eval_plan(list(drafters), settings, max_new_tokens, temperatures), quiet=False
    ).run


def evaluate(
    drafters: dict[str, Models], prompts: Sequence[Prompt], settings, max_new_tokens: int = 64, temperatures=(0.0,)
) -> dict[str, list[DrafterScore]]:
    """Scores of each drafter at each (K, T, L) setting, by drafter name."""
    return drafter_scores(evaluate_run(drafters, prompts, settings, max_new_tokens, temperatures), len(prompts))


def heldout_prompts(data_dir: Path, count: int = 50) -> tuple[Prompt, ...]:
    return default_prompts(data_dir, sgd=count, stories=0)


def acceptance_profile(models: Models, prompt_ids: list, block: int = 8, max_new_tokens: int = 64) -> dict:
    """Greedy tau at (K, T, L) = (1, 1, block) and, per block position j, the share of rounds that accepted at least
    j draft tokens (position 1 = the first draft token was right): the learning curve's figures."""
    cfg = DecodeConfig(drafts=1, steps=1, block=block, max_new_tokens=max_new_tokens)
    rounds = [a for ids in prompt_ids for a in decode_to_end(models, ids, cfg).accept_lens]
    reached = [sum(a >= j for a in rounds) / max(len(rounds), 1) for j in range(1, block + 1)]
    return {"tau": round(tokens_per_round(rounds), 4), "accepted_at": [round(r, 4) for r in reached]}
