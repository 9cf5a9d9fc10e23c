"""The counting model ``AutoControl``: ``auto`` for drafters whose drafts carry no tree of chances (K separate drafts,
the gaussian and autoregressive drafters; docs/DESIGN.md §2.6). Before each round it picks the setting with the most
expected tokens per second:

- expected tokens of a round at (K, T, L) = 1 + sum over i = 1..L of q_1 ... q_i, where q_i is the chance that block
  position i is accepted once the positions before it were, estimated per (K, T) from this request's rounds (recent
  rounds weigh more) over a prior (``AutoControl.acceptance``); L = 0 is a plain step;
- seconds of a round from a ``CostModel``: stage costs measured on the models at hand (the engine calibrates them).

When plain steps win it still drafts now and then (a probe, after 16, 32 and 64 plain rounds), so that it notices when
the text becomes predictable again. Every choice is a pure function of the costs and the request so far: the same
seed and history give the same settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .controller import (
    FIRST_PROBE,
    LAST_PROBE,
    PLAIN_STEP,
    SPECULATE_MARGIN,
    CostModel,
    RoundSetting,
    auto_longest_block,
)

# K the controller may pick. At T = 1 the K drafts share the drafter's forward and its token choice, so more drafts
# cost only their tree nodes in the verify forward: 8 pays on stories, where drafts part at the first position
# (held-out prompts interleaved, bf16, auto over plain decoding with K up to 4 / 8: greedy stories 1.28x / 1.39x,
# at 0.7 chats 1.29x / 1.33x and stories 1.05x / 1.08x, greedy chats 1.56x both).
AUTO_DRAFTS = (1, 2, 4, 8)
# T the controller may pick. One: a second denoise step never paid on our CPU (the benchmark's search: T = 1 fastest
# at every K), and trying it cost auto more than it ever won back. Held-out prompts interleaved, bf16, auto over plain
# decoding with T = 1, 2 / T = 1 only: greedy chats 1.43x / 1.62x, stories 1.38x / 1.46x; at 0.7 1.25x / 1.26x and
# 0.99x / 0.99x. An untried (K, 2) starts from (1, 1)'s first-position estimate at every position, so it looks
# better than the (K, 1) it would replace until a few rounds have shown otherwise, and a chat reply lasts few rounds.
AUTO_STEPS = (1,)
# T a drafter with a refiner head lets auto pick: its forward and up to two refinement passes (refiner.py), each a
# small head over the block, far cheaper than a denoise step's drafter forward.
AUTO_PASSES = (1, 2, 3)
# The (1, 1) acceptance chance per position before any round is seen, greedy and sampled: a sampled draft is kept only
# when the target's own draw lands on it, so the same drafter is accepted less when sampling, even with drafts
# coupled to that draw (sampling.py). One prior serves every position (each the estimate one position earlier), so it
# sits between the first position's chance and the later ones'. With draft trees (the default diversity) a (1, 1, L)
# round's first position is accepted far more often than one draft's, since an unsure first position gets the
# tree's alternatives: measured on our drafter with every position of the target's replies to 50 held-out chats and 10
# stories as a round's start, L = 4 / 8: 0.92 / 0.96 and 0.85 / 0.93 greedy, 0.81 / 0.87 and 0.63 / 0.70 at
# temperature 0.7 (one chain draft: 0.68 and 0.51, 0.59 and 0.40). Against the priors for one chain draft (0.5, 0.39),
# held-out prompts interleaved in one process, bf16, auto over plain decoding, greedy chats / stories, at 0.7 chats /
# stories: 1.714 / 1.611, 1.471 / 1.060x (0.5, 0.39); 1.707 / 1.550, 1.514 / 1.056x (0.6, 0.5); 1.787 / 1.576,
# 1.546 / 1.057x (0.7, 0.6), the best fixed setting (4, 1, 8) 1.822 / 1.624, 1.545 / 1.140x.
PRIOR_ACCEPT = 0.7
PRIOR_ACCEPT_SAMPLED = 0.6
PRIOR_WEIGHT = 2.0  # how many rounds the prior counts as
PRIOR_DECLINE = 0.8  # a position's prior against the estimate one position earlier (``AutoControl.acceptance``)
PASS_PRIOR_CAP = 0.98  # no prior says a position is sure: a pass's gain times a high estimate could pass 1
MEMORY = 0.9  # each drafting round, earlier rounds' counts are multiplied by this (recent acceptance weighs more)
# The estimates' own error, learned in the request: draft tokens accepted over those expected in its drafting rounds,
# counted like the acceptance (``MEMORY``) over a prior of ``REALISED_PRIOR`` tokens at par. The best of some fifty
# estimates is the most optimistic of them, and where the priors suit a class badly every setting is over-estimated
# alike: on sampled stories the chosen rounds expected 1.7 draft tokens and got 1.05 (embedded pair, temperature 0.7).
REALISED_PRIOR = 2.0


@dataclass(frozen=True)
class Best:
    """The search's answer: the best speculative rate (tokens per second), its setting and the draft tokens it expects
    to be accepted (the target's own token aside, and before ``AutoControl.realised_share``)."""

    rate: float
    setting: RoundSetting
    expects: float


class AutoControl:
    """The controller ``auto``: the setting with the most expected tokens per second (module docstring)."""

    counts_fewer = True  # a round at K teaches every smaller K (``observe``'s ``with_fewer``)

    def __init__(
        self,
        costs: CostModel,
        max_block: int | None,
        can_draft: bool = True,
        sampled: bool = False,
        steps: tuple[int, ...] = AUTO_STEPS,
        pass_gains: dict[int, tuple[float, ...]] | None = None,
    ):
        self.costs = costs
        self.prior_accept = PRIOR_ACCEPT_SAMPLED if sampled else PRIOR_ACCEPT
        top = auto_longest_block(max_block)
        self.pairs = [(k, t) for k in AUTO_DRAFTS for t in steps if t <= top] if can_draft else []
        # Per T > 1: how much more often each block position is accepted after T - 1 refinement passes than after the
        # drafter's forward alone, as the drafter measured on held-out text (``Drafter.pass_gains``).
        self.pass_gains = pass_gains or {}
        self.max_block = top
        # Per (K, T): decayed counts, per block position, of rounds that reached it and of those that accepted it.
        self.reached = {pair: [0.0] * top for pair in self.pairs}
        self.accepted = {pair: [0.0] * top for pair in self.pairs}
        self.plain_run, self.probe_after = 0, FIRST_PROBE
        self.realised, self.expected = 0.0, 0.0  # decayed draft tokens accepted / expected in drafting rounds
        self.chosen_expects: float | None = None  # draft tokens the setting chosen last expects (None: untried)
        self.searched: tuple[int, Best] | None = None  # (longest block, best) on these counts

    def acceptance(self, pair: tuple[int, int]) -> list[float]:
        """q_i per block position: this (K, T)'s counts over a prior worth ``PRIOR_WEIGHT`` rounds.

        The prior at the first position: ``PRIOR_ACCEPT`` (``PRIOR_ACCEPT_SAMPLED`` when sampling) for one draft,
        (1, 1); for K drafts the chance that one of them is right, ``1 - (1 - q)^sqrt(K)`` with q the single draft's
        estimate (K drafts branch on the drafter's top K tokens, which are not independent guesses: measured on our
        drafter, 50 held-out chats, K = 2 and 4 accept the first position in 0.80 and 0.89 of greedy rounds where one
        draft does in 0.68, and 0.71 and 0.79 against 0.59 at temperature 0.7; sqrt(K) gives 0.80, 0.90 and 0.72,
        0.83). Further on, the estimate one position earlier (a block accepted whole invites a longer one), times
        ``PRIOR_DECLINE`` at the first position no round reached and right after a branched first position (where K
        drafts help no more: 0.77 then 0.48 at K = 4, against 0.54 then 0.55 for one draft, an earlier drafter). The
        pair's own counts replace these guesses as rounds come in."""
        reached, accepted = self.reached[pair], self.accepted[pair]
        if pair[1] in self.pass_gains:
            # Refinement passes: the same drafts' (K, 1) estimate, position by position, times the passes' measured gain.
            base = self.acceptance((pair[0], 1))
            priors = [min(PASS_PRIOR_CAP, b * g) for b, g in zip(base, self.pass_gains[pair[1]])]
            return [(a + PRIOR_WEIGHT * p) / (r + PRIOR_WEIGHT) for a, r, p in zip(accepted, reached, priors)]
        if pair == (1, 1):
            prior = self.prior_accept
        else:
            prior = 1.0 - (1.0 - self.acceptance((1, 1))[0]) ** math.sqrt(pair[0])
        q: list[float] = []
        for i, (a, r) in enumerate(zip(accepted, reached)):
            if i > 0:
                frontier = r == 0 and reached[i - 1] > 0  # the first position no round reached
                branched = i == 1 and pair[0] > 1  # right after the position K drafts branch on
                prior = q[-1] * (PRIOR_DECLINE if frontier or branched else 1.0)
            q.append((a + PRIOR_WEIGHT * prior) / (r + PRIOR_WEIGHT))
        return q

    def best(self, remaining: int) -> Best:
        """The speculative setting with the most expected tokens per second."""
        longest = min(self.max_block, remaining - 1)  # drafting past the reply's end gains nothing
        # Plain rounds change no count: a run of them reuses one search instead of paying it every token.
        if self.searched is None or self.searched[0] != longest:
            self.searched = (longest, self.search(longest))
        return self.searched[1]

    def realised_share(self) -> float:
        """Draft tokens this request's drafting rounds accepted per token their estimates expected (``REALISED_PRIOR``)."""
        return (self.realised + REALISED_PRIOR) / (self.expected + REALISED_PRIOR)

    def search(self, longest: int) -> Best:
        share, best = self.realised_share(), Best(0.0, PLAIN_STEP, 0.0)
        for k, t in self.pairs:
            expects, chain = 0.0, 1.0
            for block, q in enumerate(self.acceptance((k, t))[:longest], start=1):
                chain *= q
                expects += chain
                if block < t:  # T <= L
                    continue
                setting = RoundSetting(k, t, block)
                rate = (1.0 + share * expects) / self.costs.round_s(setting)
                if rate > best.rate:
                    best = Best(rate, setting, expects)
        return best

    def choose(self, remaining: int) -> RoundSetting:
        best = self.best(remaining)
        rate, setting = best.rate, best.setting
        # Only an estimate that rests on rounds of its own teaches the share: a pair never tried is the priors' guess,
        # and its failure already lowers the counts that the next guesses start from.
        tried = not setting.plain and self.reached[(setting.drafts, setting.steps)][0] > 0
        self.chosen_expects = best.expects if tried else None
        plain_rate = 1.0 / self.costs.round_s(PLAIN_STEP)
        if setting.plain:
            return PLAIN_STEP
        if rate > plain_rate * SPECULATE_MARGIN:
            self.probe_after = FIRST_PROBE
            return setting
        if self.plain_run >= self.probe_after:  # a probe: does drafting pay again?
            self.probe_after = min(2 * self.probe_after, LAST_PROBE)
            return setting
        return PLAIN_STEP

    def observe(self, setting: RoundSetting, accepted: int, with_fewer: tuple[int, ...] = ()) -> None:
        """Count a round: positions 1..accepted were accepted, position accepted + 1 (if drafted) was not.
        ``with_fewer`` (per k = 1..K, what the round would have accepted with k drafts, ``engine.accepted_with_fewer``)
        counts the round for fewer drafts at the same T too: a round at K = 4 teaches K = 1 and 2."""
        if setting.plain:
            self.plain_run += 1
            return
        self.plain_run, self.searched = 0, None
        if self.chosen_expects is not None:
            self.realised = MEMORY * self.realised + accepted
            self.expected = MEMORY * self.expected + self.chosen_expects
        for pair in self.pairs:
            self.reached[pair] = [MEMORY * r for r in self.reached[pair]]
            self.accepted[pair] = [MEMORY * a for a in self.accepted[pair]]
        self.count((setting.drafts, setting.steps), setting.block, accepted)
        for k in AUTO_DRAFTS:
            if k < setting.drafts and k <= len(with_fewer) and (k, setting.steps) in self.reached:
                self.count((k, setting.steps), setting.block, with_fewer[k - 1])

    def to_verify(self, drafts):
        """The counting model verifies what it chose to draft."""
        return drafts

    def timed(self, measured) -> None:
        """The counting model plans at the calibrated prices only."""

    def count(self, pair: tuple[int, int], block: int, accepted: int) -> None:
        """One round of a pair in its counts: positions 1..accepted accepted, the next one (if drafted) reached."""
        reached, hits = self.reached[pair], self.accepted[pair]
        for i in range(min(accepted + 1, block)):
            reached[i] += 1.0
            hits[i] += 1.0 if i < accepted else 0.0
