"""Why a reply was faster or slower than plain decoding: its rounds' cost counted in plain decoding steps.

A drafting round emits τ tokens on average and costs as much as ``c`` plain steps (draft + verify + other, from the
engine's own timings, over the time of one plain decoding step). Plain decoding emits one token per step, so the
rounds pay off when τ > c: ``c`` is the break-even τ and τ / c the speedup over plain decoding, the prefill aside
(both pay the same). Pure functions of the engine's events and one measured plain step; nothing here imports Gradio.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .config import DecodeConfig
from .engine import Models, decode
from .trace import RoundTrace, tokens_per_round

STAGES = ("draft", "verify", "other")
CALIBRATION_TOKENS = 16  # plain steps timed per calibration run
CALIBRATION_ROUNDS = 32  # plain steps timed in all (runs repeat when the target stops early)
CALIBRATION_RUNS = 8  # at most, warm-up included
AFTER_REPLY_TOKENS = 8  # plain steps timed after a reply that measured none itself


@dataclass(frozen=True)
class RoundCost:
    """The drafting rounds of one reply (the prefill excluded) against one plain decoding step."""

    accept_lens: tuple[int, ...]  # draft tokens accepted in each round
    draft_s: float  # totals over the rounds, the engine's own timings
    verify_s: float
    other_s: float
    plain_step_s: float  # one plain decoding step (a one-token target forward and its bookkeeping)

    @property
    def rounds(self) -> int:
        return len(self.accept_lens)

    @property
    def tau(self) -> float:
        """Tokens emitted per round: the accepted draft tokens plus the target's own."""
        return tokens_per_round(self.accept_lens)

    def steps(self, stage: str) -> float:
        """What a round spent in ``stage`` on average, in plain steps."""
        return getattr(self, f"{stage}_s") / self.rounds / self.plain_step_s

    @property
    def plain_steps(self) -> float:
        """A round's cost in plain steps: also the break-even τ (plain decoding emits one token per step)."""
        return sum(self.steps(stage) for stage in STAGES)

    @property
    def speedup(self) -> float:
        """Tokens per second over plain decoding's, prefill aside: τ tokens for the price of ``plain_steps``."""
        return self.tau / self.plain_steps


def round_cost(traces: Sequence[RoundTrace], plain_step_s: float) -> RoundCost | None:
    """The cost of the drafting rounds in ``traces`` (round 0, the prefill, is left out); None before the first."""
    rounds = [t for t in traces if t.index > 0]
    if not rounds or plain_step_s <= 0:
        return None
    return RoundCost(
        accept_lens=tuple(t.accept_len for t in rounds),
        draft_s=sum(t.draft_s for t in rounds),
        verify_s=sum(t.verify_s for t in rounds),
        other_s=sum(t.other_s for t in rounds),
        plain_step_s=plain_step_s,
    )


def headline(cost: RoundCost) -> str:
    """τ, a round's cost in plain steps, and the speedup they give."""
    speed = f"{cost.speedup:.2f}× faster than plain" if cost.speedup >= 1 else f"{cost.speedup:.2f}× plain's speed"
    return f"τ {cost.tau:.2f} × (1 / {cost.plain_steps:.2f} plain steps per round) → {speed}"


def breakdown(cost: RoundCost) -> str:
    """Where a round's time went, in plain steps, and the τ it takes to break even."""
    split = " + ".join(f"{stage} {cost.steps(stage):.2f}" for stage in STAGES)
    return f"a round = {split} plain steps of {1000 * cost.plain_step_s:.3f} ms · break-even τ {cost.plain_steps:.2f}"


def setting_label(trace: RoundTrace) -> str:
    """The (K, T, L) a round drafted with (the controller ``auto`` picks one per round), or that it was a plain step."""
    drafts, steps, block = trace.setting
    return "plain step" if block == 0 else f"K={drafts} T={steps} L={block}"


def settings_summary(traces: Sequence[RoundTrace]) -> str:
    """How many drafting rounds ran at each setting, most used first (ties: first used first)."""
    counts = Counter(setting_label(t) for t in traces if t.index > 0)
    return " · ".join(f"{label} × {n}" for label, n in counts.most_common())


def plain_step_s(traces: Sequence[RoundTrace]) -> float | None:
    """Mean time of the plain decoding steps among ``traces``: the rounds that drafted nothing (a run without a
    drafter, or the plain steps the controller chose), the prefill excluded. None if there is none."""
    steps = [t.draft_s + t.verify_s + t.other_s for t in traces if t.index > 0 and not t.drafts]
    return sum(steps) / len(steps) if steps else None


def calibrate_plain_step(plain: Models, prompt_ids: torch.Tensor) -> float | None:
    """Time one plain decoding step of ``plain`` (a target without a drafter) on ``prompt_ids``, greedy.

    A first run warms up; then runs of ``CALIBRATION_TOKENS`` repeat until ``CALIBRATION_ROUNDS`` steps are timed (a
    target may end its reply early) or ``CALIBRATION_RUNS`` runs have gone. None if every run ended at its first token.
    """
    timed: list[RoundTrace] = []
    for run in range(CALIBRATION_RUNS):
        traces = plain_rounds(plain, prompt_ids, CALIBRATION_TOKENS)
        if run > 0:
            timed += traces
        if len([t for t in timed if t.index > 0]) >= CALIBRATION_ROUNDS:
            break
    return plain_step_s(timed)


def time_plain_steps(plain: Models, prompt_ids: torch.Tensor, tokens: int = AFTER_REPLY_TOKENS) -> float | None:
    """One plain decoding step of ``plain`` (already warm), timed over ``tokens`` steps on ``prompt_ids``: right after
    a reply, on its prompt, the machine is in the state the reply's rounds saw (a timing at load may not be)."""
    return plain_step_s(plain_rounds(plain, prompt_ids, tokens))


def plain_rounds(plain: Models, prompt_ids: torch.Tensor, tokens: int) -> list[RoundTrace]:
    """The rounds of a greedy plain run of at most ``tokens`` tokens."""
    return [e for e in decode(plain, prompt_ids, DecodeConfig(max_new_tokens=tokens)) if isinstance(e, RoundTrace)]
