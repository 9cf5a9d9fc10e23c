"""Why a reply was faster or slower than plain decoding: its rounds' cost counted in plain decoding steps.

A drafting round emits τ tokens on average and costs as much as ``c`` plain steps (draft + verify + other, from the
engine's own timings, over the time of one plain decoding step). Plain decoding emits one token per step, so the
rounds pay off when τ > c: ``c`` is the break-even τ and τ / c the rounds' speedup over plain decoding. The whole
reply also waits for the prefill, which plain decoding pays alike: a short reply's speedup is the rounds' diluted by
it (``ReplyCost``), and that is what a Race measures. With refinement passes, it also says what they bought
(``refinement_gain``). Pure functions of the engine's events and one measured plain step; nothing here imports Gradio.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .config import DecodeConfig
from .engine import Models, decode
from .trace import DecodeResult, RoundTrace, tokens_per_round
from .tree import common_prefix

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


@dataclass(frozen=True)
class ReplyCost:
    """A whole reply against plain decoding of the same tokens: the same prefill (it gives the first token), then one
    plain step for each token after it."""

    rounds: RoundCost
    prefill_s: float
    tokens_after_prefill: int  # the tokens the rounds emitted

    @property
    def time_s(self) -> float:
        r = self.rounds
        return self.prefill_s + r.draft_s + r.verify_s + r.other_s

    @property
    def plain_s(self) -> float:
        """What plain decoding would take for these tokens, at the measured plain step."""
        return self.prefill_s + self.tokens_after_prefill * self.rounds.plain_step_s

    @property
    def speedup(self) -> float:
        return self.plain_s / self.time_s


def reply_cost(traces: Sequence[RoundTrace], plain_step_s: float) -> ReplyCost | None:
    """The reply so far (``traces``, the prefill first) against plain decoding; None before the first round."""
    rounds = round_cost(traces, plain_step_s)
    if rounds is None or traces[0].index != 0:
        return None
    emitted = sum(len(t.emitted) for t in traces if t.index > 0)
    return ReplyCost(rounds, traces[0].verify_s, emitted)


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


def speed(speedup: float) -> str:
    return f"{speedup:.2f}× faster than plain" if speedup >= 1 else f"{speedup:.2f}× plain's speed"


def headline(cost: RoundCost) -> str:
    """τ, a round's cost in plain steps, and the speedup they give (the prefill aside)."""
    return f"τ {cost.tau:.2f} × (1 / {cost.plain_steps:.2f} plain steps per round) → {speed(cost.speedup)}"


def reply_headline(cost: ReplyCost) -> str:
    """The whole reply's speedup, then the rounds' own, each labelled."""
    return (
        f"whole reply (prefill {1000 * cost.prefill_s:.0f} ms included): {speed(cost.speedup)} · "
        f"per round: {headline(cost.rounds)}"
    )


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


@dataclass(frozen=True)
class RefinementGain:
    """What a reply's refinement passes bought (docs/DESIGN.md §3.5), from its rounds (``refinement_gain``)."""

    changed: int  # draft nodes the passes added to pass 0's drafts (each once), within the verified depth
    changed_accepted: int  # of those, the ones on an accepted path
    tau: float  # the reply's τ
    # τ had every round verified its pass-0 draft instead, each round from the prefix it started from: exact per round
    # (the target's token at each position is the one it emitted, up to its rounding), a lower bound where pass 0's
    # draft matched every token the round emitted and went on (``at_least``).
    tau_without: float
    at_least: bool  # tau_without is a lower bound: shown as "≥"


def refinement_gain(traces: Sequence[RoundTrace]) -> RefinementGain | None:
    """What the refinement passes did in these rounds (the prefill left out); None when no round ran any."""
    rounds = [t for t in traces if t.index > 0]
    if not any(t.refinement for t in rounds):
        return None
    changed, accepted, without, at_least = 0, 0, [], False
    for trace in rounds:
        refinement = trace.refinement
        if refinement is None:  # no passes: the round's draft was pass 0's
            without.append(trace.accept_len)
            continue
        depth = tree_depth(trace.tree_parents)  # near the context's end the drafts were cut (engine.cut_drafts)
        # The nodes the passes drafted that pass 0's drafts did not hold (a node is its path: a token changed
        # earlier on its row makes every later token a new node, read in another context).
        held = {path[: j + 1] for path in refinement.before for j in range(len(path))}
        nodes = {row[: j + 1] for row in refinement.after for j in range(min(depth, len(row)))} - held
        changed += len(nodes)
        accepted += sum(trace.accepted[: len(node)] == node for node in nodes)
        # Greedy or sampled, the target's token after a prefix is the one it emitted there (one noise vector per
        # emitted token: sampling.py): pass 0's draft would have been accepted as far as it matches the round's
        # emitted tokens, and no further. Per path of pass 0's draft: (tokens matched, tokens verified).
        emitted = len(trace.emitted)
        paths = [(common_prefix(path[:depth], trace.emitted), len(path[:depth])) for path in refinement.before]
        matched = max(m for m, _ in paths)
        if matched == emitted < trace.accept_len + 1:
            # The reply stopped inside this round's accepted tokens, and pass 0 reached the stop too: the same
            # tokens in the same rounds, so the round counts as it did.
            matched = trace.accept_len
        else:
            # A path that matched every emitted token and goes on would have been accepted further, how far unseen.
            at_least |= any(m == emitted < length for m, length in paths)
        without.append(matched)
    return RefinementGain(
        changed, accepted, tokens_per_round([t.accept_len for t in rounds]), tokens_per_round(without), at_least
    )


def tree_depth(parents: Sequence[int]) -> int:
    """The longest path of a draft tree given its nodes' parents (parents before children; the root's is -1)."""
    depths = [0]
    for parent in parents[1:]:
        depths.append(depths[parent] + 1)
    return max(depths)


def refinement_line(gain: RefinementGain) -> str:
    """What the passes changed and what that bought in τ."""
    without = f"{'≥ ' if gain.at_least else ''}{gain.tau_without:.2f}"
    return (
        f"Refinement passes: {gain.changed} new draft tokens, {gain.changed_accepted} of them accepted · "
        f"τ {gain.tau:.2f} with them, {without} without (pass 0's drafts against the tokens emitted)"
    )


def plain_step_s(traces: Sequence[RoundTrace]) -> float | None:
    """Mean time of the plain decoding steps among ``traces``: the rounds that drafted nothing (a run without a
    drafter, or the plain steps the controller chose), the prefill excluded. None if there is none."""
    steps = [t.draft_s + t.verify_s + t.other_s for t in traces if t.index > 0 and not t.drafts]
    return sum(steps) / len(steps) if steps else None


def fastest_plain(choice, step_s: float) -> tuple[float, str]:
    """A plain step timed in the run dtype as plain decoding in the faster dtype on this machine takes it, and a note
    saying so ("" where the run dtype's plain decoding is the faster or nothing was measured): the dtype choice's own
    figures (``DtypeChoice.timings``, timed in turns at load) scale it. Every speedup is over the fastest plain
    decoding, not over plain decoding in a dtype that a user who turns the drafter off would not pick."""
    timings = getattr(choice, "timings", None) or {}
    if choice is None or choice.dtype not in timings:
        return step_s, ""
    fastest = min(timings, key=lambda name: timings[name].plain_step_s)
    factor = timings[fastest].plain_step_s / timings[choice.dtype].plain_step_s
    if fastest == choice.dtype or factor >= 1.0:
        return step_s, ""
    return step_s * factor, f"against plain decoding in {fastest}, {1 / factor:.2f}x faster per step here"


def against_fastest_plain(traces: Sequence[RoundTrace], choice) -> dict | None:
    """The reply (``traces``, the prefill first) against the fastest plain decoding on this machine, from the plain
    steps the dtype choice timed at load (``fastest_plain``): the CLI's ``--json``. None where nothing was timed (a
    pinned dtype) or no round ran."""
    timings = getattr(choice, "timings", None) or {}
    if choice is None or choice.dtype not in timings:
        return None
    step_s, note = fastest_plain(choice, timings[choice.dtype].plain_step_s)
    cost = reply_cost(traces, step_s)
    if cost is None:
        return None
    dtype = min(timings, key=lambda name: timings[name].plain_step_s) if note else choice.dtype
    return {"dtype": dtype, "plain_step_s": step_s, "speedup": cost.speedup, "rounds_speedup": cost.rounds.speedup}


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


# The Race's measured speedup and the verdict's predicted one agree within this share of the prediction.
AGREEMENT = 0.15


def race_speedup(speculative: DecodeResult, plain: DecodeResult, plain_share: float = 1.0) -> float:
    """Tokens/s of the speculative run over the plain run's, each from its own start (prefill included);
    ``plain_share``: the plain run's time as the faster dtype's plain decoding takes it (``fastest_plain``)."""
    return speculative.tokens_per_s * plain_share / plain.tokens_per_s if plain.tokens_per_s > 0 else 0.0


def agreement(
    predicted: ReplyCost, speculative: DecodeResult, plain: DecodeResult, plain_share: float = 1.0
) -> tuple[bool, str]:
    """Whether the Race's measured speedup is the verdict's prediction (within ``AGREEMENT``), and a line saying so or
    why not. Both count the plain run's own steps, so for the same tokens they differ only by the two prefills of
    the same prompt: apart, the machine ran at different speeds for the two runs, and neither figure is the
    speedup."""
    measured = race_speedup(speculative, plain, plain_share)
    if predicted.speedup > 0 and abs(measured / predicted.speedup - 1) <= AGREEMENT:
        return True, f"agrees with the verdict's whole reply (×{predicted.speedup:.2f}) ✓"
    return False, (
        f"⚠ not a fair measurement this time: the verdict's whole reply says ×{predicted.speedup:.2f}, the Race "
        f"×{measured:.2f}, because the same prompt's prefill took {1000 * speculative.prefill_s:.0f} ms in the "
        f"speculative run and {1000 * plain.prefill_s:.0f} ms in the plain one: the machine's speed changed between "
        "them (other work on it, or a prompt length met for the first time). Send it again for a fair race."
    )
