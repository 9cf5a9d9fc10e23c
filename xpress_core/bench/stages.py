"""The benchmark's two stages: a greedy search over every setting on a few prompts, then the finalists measured on all
prompts, at every temperature, with repeats."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ..data import Prompt
from .measure import BenchRun, RunPlan, measure
from .methods import REFERENCE, XPRESS, BenchModels, Setting
from .summary import Summary, best_per_method

# Two stages keep the full grid affordable on a 2-core CPU: the search stage runs every setting once, greedy, on a
# spread subset of the prompts; the final stage measures the finalists (the best setting of every method, the top
# xPress settings) on all prompts, at every temperature, with repeats. Grids this small skip the search.
SEARCH_PROMPTS = 12


FINALISTS = 3


SEARCH_STAGE, FINAL_STAGE = "search", "final"


@dataclass(frozen=True)
class Stage:
    name: str  # SEARCH_STAGE or FINAL_STAGE
    prompts: tuple[Prompt, ...]
    plan: RunPlan
    run: BenchRun


def choose_finalists(summaries: Sequence[Summary], count: int) -> tuple[Setting, ...]:
    """``generate`` in every dtype measured (the reference first), the fastest setting of every other method, and the
    ``count`` fastest xPress settings (greedy), for the final stage."""
    generate = [s.setting for s in summaries if s.setting.method == REFERENCE and s.temperature == 0.0]
    best = [s.setting for m, s in best_per_method(summaries, 0.0).items() if m not in (XPRESS, REFERENCE)]
    xpress = sorted(
        (s for s in summaries if s.setting.method == XPRESS and s.temperature == 0.0),
        key=lambda s: s.tokens_per_s,
        reverse=True,
    )
    return tuple(generate + best + [s.setting for s in xpress[:count]])


def run_stage(name: str, models: BenchModels, prompts: Sequence[Prompt], plan: RunPlan, quiet: bool) -> Stage:
    from tqdm import tqdm

    with tqdm(total=0, unit="call", desc=name, disable=quiet, file=sys.stderr) as bar:

        def progress(done: int, total: int, label: str) -> None:
            bar.total = total
            bar.set_postfix_str(label, refresh=False)
            bar.update(done - bar.n)

        run = measure(models, prompts, plan, progress)
    return Stage(name, tuple(prompts), plan, run)
