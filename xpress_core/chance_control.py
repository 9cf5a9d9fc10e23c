"""``auto`` by what each round's draft tree says about itself (docs/DESIGN.md §2.6): ``ChanceControl`` drafts a tree,
reads its nodes' chances and verifies the cut that gains most over plain steps (``best_cut``), at prices corrected by
the times its rounds measured (``MeasuredCosts``). Its constants were chosen on the tune half of the prompt sets only
(``data.split_of``; lab log, "auto by the drafter's own chances").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from itertools import accumulate, islice

from .controller import CHANCE_DRAFTS, MEMORY, PLAIN_STEP, CostModel, RoundSetting, auto_longest_block

# Per depth d of a tree: how often the target accepts d draft tokens per time the kept nodes of depth d expect it (their
# chances' sum), before a request's own rounds: SHARE_PRIOR x SHARE_DECLINE^(d - 1), greedy / sampled. One share for
# every depth mispriced the deep nodes against the wide ones: over whole 2 x 8 trees of the tune half (64 tokens) the
# ratio by depth 1..6 was greedy 1.03 0.99 1.01 0.93 0.85 0.82 on chats but 1.09 1.12 1.16 1.50 2.12 2.48 on stories
# (a draft accepted deep was a predictable stretch: its later positions are likelier than their own chances say), and
# at 0.7 0.98 0.76 0.68 0.54 0.40 0.30 on chats (the coupled draws miss more at each further position): the greedy
# cut kept side branches for the chain's tail, the sampled one kept tails that were not accepted. Each depth learns
# its own share in the request (``ChanceControl.shares``), over a prior worth ``SHARE_WEIGHT`` expected tokens.
SHARE_PRIOR, SHARE_DECLINE, SHARE_DECLINE_SAMPLED = 1.0, 1.0, 0.8
# The rate a round's time could earn otherwise, in plain steps' tokens per plain step: a cut is worth its tokens less
# this rate times its seconds (what the same time earns at the decoding's own pace, not at plain decoding's). At 1 the
# cut took every node worth its own verify time and ran below one fixed chain (tune half, greedy chats: auto 1.37x
# plain, (1, 1, 8) 1.45x, (4, 1, 8) 1.34x). Greedy, the rate is what a round of one chain of the longest block earns at
# the prices at hand when it yields ``CHAIN_TOKENS`` tokens, so that it follows the prices: the constant 1.4 chosen at
# fp32 prices (the best fixed settings' rates there) kept nodes and drafts that bf16 prices do not pay for, where a
# draft is cheaper against a plain step and every fixed setting earns more (tune half, bf16 prices, 1.4 / 1.78: chats
# 1.882 / 1.919x, short chats 2.046 / 2.093x, stories 1.581 / 1.679x). 3.0 is 1.4 times that chain's round at the fp32
# prices 1.4 was chosen at (2.14 plain steps, docs/replay_costs48.json), near (1, 1, 8)'s 3.1 tokens a round on tune
# chats. Sampled, plain decoding's own rate, 1: a sampled cut keeps one chain (``CUT_DRAFTS_SAMPLED``), whose length
# costs little, so the rate mostly decides between a draft and a plain round, and the time a plain round takes earns
# one token. 1.15 (chosen when one miss stopped drafting) asked a draft for 15 % more than it pays over a plain round;
# with ``MISSES_SAMPLED`` at 2, tune half, 4 seeds, over plain, 1.15 / 1: bf16 prices chats 1.517 / 1.516x, short
# chats 1.657 / 1.664x, stories 1.159 / 1.178x ((1, 1, 8): 1.529, 1.673, 1.190x); fp32 prices 1.208 / 1.230x, 1.293 /
# 1.299x, 0.974 / 0.987x ((1, 1, 8): 1.234, 1.314, 0.931x).
CHAIN_TOKENS, RATE_SAMPLED = 3.0, 1.0
SHARE_WEIGHT = 1.0  # expected draft tokens of one depth the share's prior counts as
# What a drafting round gains over plain steps in the same time (plain steps) before a request drafts: the draft is
# taken when the expected gain beats the draft's own price. A round counts what its cut's chances promise, weighed by
# the shares per depth (which carry what the request's rounds realised): a realised gain is one draw of a round's
# accepted length, and one short round after a good prior stopped drafting for the rounds a chat reply lasts (tune
# half, 64 tokens, over plain, realised / promised: greedy chats 1.416 / 1.470x, stories 1.452 / 1.452x; at 0.7 0.978
# / 0.968x on stories). Each drafting round counts ``GAIN_MEMORY`` times the ones before (consecutive rounds are
# alike, a reply's start says little about its end) over a prior worth ``GAIN_WEIGHT`` rounds, which decays with them.
# Greedy, where the chances are calibrated or understate, the prior counts 3 rounds and the memory 0.8: a bad start
# costs no drafting, drafts that keep failing wash the prior out after about three. Sampling, where they overstate,
# one round and 0.5 (3 and 0.5 there: tune stories 0.968 -> 0.896x, below plain). A prior that did not decay kept a
# floor of 0.56 plain steps whatever the rounds said: drafting every round once a draft costs less (tune half, greedy,
# floor / decaying: stories 1.517 / 1.419x, chats 1.439 / 1.470x; lab log, "auto held out, again").
GAIN_PRIOR, GAIN_WEIGHT, GAIN_WEIGHT_SAMPLED, GAIN_MEMORY, GAIN_MEMORY_SAMPLED = 1.5, 3.0, 1.0, 0.8, 0.5
# Sampled, a request stops drafting (the expected gain below the draft's price) only after this many drafting rounds in
# a row that did not pay theirs. A sampled round's accepted length is one noisy draw, and a miss says little of the
# next round: over the tune half's (1, 1, 8) rounds at 0.7 (4 seeds, 1,149 rounds, stop 55's engine) the next round
# accepted 0.89 tokens after one that accepted none, 0.84 after two and 0.69 after three, against 1.55 overall, where a
# drafting round (6.9 ms, one thread, bf16) pays over a plain one (4.1 ms) from about 0.70. One miss (stop 53) sent
# 26 % of the held chats' rounds plain; two (stop 54) stopped drafting where the next round still paid: at three, tune
# half, real time, 4 seeds, over two: chats 1.007x, short chats 1.015x, stories 1.053x, level with never stopping and
# with (1, 1, 8) on stories; replayed at fixed prices, stories 1.047 -> 1.072x plain (lab log, "Sampled auto: three
# misses", stop 55).
MISSES_SAMPLED = 3


# A drafting round's gain counts its cut's promise or what it realised (accepted tokens less the same price): greedy the
# larger, since greedy chances understate predictable stretches (stories, realised/expected 1.3) and a few low promises
# stopped drafting on stories that (1, 1, 8) drafts at 1.0-1.3x (tune half, fp32 prices, promise only / the larger:
# stories 1.419 / 1.517x, chats 1.470 / 1.467x). Sampled, what it realised alone: the promises overstate (0.7), the
# shares per depth already carry what rounds realised, and the smaller of the two is biased low, so that one round
# that accepted little in a short reply stopped drafting for the next two (tune half, bf16 prices, the smaller / the
# realised: chats 1.494 / 1.492x, short chats 1.756 / 1.762x, stories 1.111 / 1.170x; fp32 prices 1.206 / 1.208x,
# 1.347 / 1.356x, 0.989 / 0.991x).
def realised_gain(promised: float, realised: float) -> float:
    return realised


GAIN_BY, GAIN_BY_SAMPLED = max, realised_gain
# Plain rounds before a draft that the expected gain does not ask for (a probe), doubling after each probe that did not
# pay, back to the first after one that did: a bad start costs a few rounds of a chat reply, never the rest of it.
PROBE_FIRST, PROBE_MAX = 2, 16
# K of a request's first draft tree (``next_drafts`` grows it): a short reply lasts two or three rounds, and a wide
# first tree's search costs more than its branches return (tune half, 64 tokens, over plain, first K 8 / 2: greedy
# short chats 1.624 / 1.736x, chats 1.427 / 1.442x, stories 1.467 / 1.475x; at 0.7 the same within 0.01).
FIRST_DRAFTS = 2
# K a cut may keep, greedy and sampled. When sampling, a cut keeps L nodes at most (K = 1): the coupled drafts' other
# branches are accepted far less often than their chances say, and such cuts got the most on the tune half (64 tokens,
# over plain, K up to 8 / 2 / 1: chats 1.181 / 1.211 / 1.232x, short chats 1.281 / 1.323 / 1.378x, stories 0.962 /
# 0.957 / 0.965x; realised/expected 0.78 -> 0.83 on chats); greedy they lost (chats 1.442 -> 1.375x). Greedy, two
# drafts at most: the side branches of wider cuts are each worth little, and their nodes and wider trees' search cost
# more than they returned (tune half, K up to 8 / 2, bf16 prices: chats 1.919 / 1.887x, short chats 2.093 / 2.198x,
# stories 1.679 / 1.678x; fp32 prices: 1.467 / 1.470x, 1.745 / 1.821x, 1.508 / 1.539x; the best fixed setting (2, 1, 8)
# on chats at both).
CUT_DRAFTS, CUT_DRAFTS_SAMPLED = (1, 2), (1,)
# The calibrated prices are corrected by what this request's rounds measured: per stage, the measured seconds over the
# calibrated ones, over a prior of ``MEASURED_WEIGHT`` rounds at par, each round's ratio clipped to ``MEASURED_CLIP`` (a
# round on a shared machine can take several times its price once, which says nothing of the next). Measured in one
# process on 8 tune prompts, 1 thread, against that process's calibration: a verify over 8 / 32 drafted nodes took 0.93
# / 0.89x its price in bf16 and 0.89 / 0.85x in fp32, the draft 0.89-1.04x in bf16 but 1.10-1.36x in fp32, a
# drafting round's walk and commit 0.73-1.06x, a plain step 1.0-1.04x.
MEASURED_WEIGHT, MEASURED_CLIP = 4.0, (0.5, 2.0)


@dataclass(frozen=True)
class MeasuredCosts:
    """The calibrated costs of the stages ``ChanceControl`` weighs, each times what the request measured against it
    (``StagePrices.ratios``): the draft, a drafting round past its draft (verify, walk, commit) and a plain round."""

    costs: CostModel
    draft: float = 1.0
    rest: float = 1.0
    plain: float = 1.0

    @cached_property
    def plain_s(self) -> float:  # read several times a round, by every price against a plain step
        return self.plain * self.costs.round_s(PLAIN_STEP)

    def round_s(self, setting: RoundSetting) -> float:
        if setting.plain:
            return self.plain_s
        return self.tree_draft(setting) + self.after_draft_s(setting.drafts * setting.block)

    def after_draft_s(self, nodes: int) -> float:
        return self.rest * self.costs.after_draft_s(nodes)

    def tree_draft(self, setting: RoundSetting) -> float:
        return self.draft * self.costs.tree_draft(setting)


class StagePrices:
    """Per stage of a round (draft, rest of a drafting round, plain round): the rounds that measured it and their
    ratios of measured to calibrated seconds summed, decayed by ``MEMORY`` each time the stage is measured; their mean
    over a prior (``MEASURED_WEIGHT``) corrects the calibrated price."""

    STAGES = ("draft", "rest", "plain")

    def __init__(self):
        self.sums = {stage: [0.0, 0.0] for stage in self.STAGES}  # (rounds, ratios summed)

    def add(self, stage: str, measured_s: float, priced_s: float) -> None:
        if priced_s <= 0.0:
            return
        low, high = MEASURED_CLIP
        rounds, ratios = self.sums[stage]
        self.sums[stage] = [MEMORY * rounds + 1.0, MEMORY * ratios + min(high, max(low, measured_s / priced_s))]

    def ratios(self) -> dict[str, float]:
        """Per stage: the rounds' mean ratio over a prior of ``MEASURED_WEIGHT`` rounds at 1."""
        return {
            stage: (ratios + MEASURED_WEIGHT) / (rounds + MEASURED_WEIGHT)
            for stage, (rounds, ratios) in self.sums.items()
        }


@dataclass(frozen=True)
class TreeCut:
    """What of a drafted tree a round verifies: the first K x L nodes (best-first order) of depth L at most."""

    setting: RoundSetting  # (K, 1, L); PLAIN_STEP: the root alone
    nodes: int
    expects: float  # draft tokens the kept nodes' chances expect (before the shares)
    gain: float  # over a plain step's: expected tokens less the rate (``ChanceControl.rate``) x the rest's plain steps


def node_chances(drafts) -> list[tuple[int, float]]:
    """Per node of a draft tree (``Drafts.order``, best first): (depth, the chance it is reached and accepted, its
    path's product of chances)."""
    nodes: dict[int, tuple[int, float]] = {}
    for orders, chances in zip(drafts.order, drafts.chances):
        product = 1.0
        for depth, (node, chance) in enumerate(zip(orders, chances), start=1):
            product *= chance
            nodes.setdefault(node, (depth, product))
    return [nodes[n] for n in sorted(nodes)]


def best_cut(
    nodes: list[tuple[int, float]],
    longest: int,
    share: float,
    costs: CostModel | MeasuredCosts,
    rate: float,
    drafts: tuple[int, ...] = CUT_DRAFTS,
) -> TreeCut:
    """The cut with the largest gain over a plain step: per L, the first K x L nodes of depth <= L (a tree: a node's
    ancestors come before it and are shallower) for K in ``drafts``; gain = share x their chances' sum - ``rate``
    x (the round's rest, its verify, walk and commit, in plain steps - 1). The draft is paid already: it does not
    enter."""
    plain_s, widest = costs.round_s(PLAIN_STEP), max(drafts)
    # Every round runs this search: the best so far stays plain values (one TreeCut at the end), and a node count's
    # price, which several (K, L) share, is computed once.
    best, spent = (0.0, 0, 0, 0, 0.0), {}  # (gain, K, L, nodes, their chances' sum); K = 0: the root alone
    for block in range(1, longest + 1):
        # The first K x L nodes are all a cut reads: a round runs this search, so it sums no further.
        sums = list(accumulate(islice((p for d, p in nodes if d <= block), widest * block)))
        for k in drafts:
            count = min(k * block, len(sums))
            if count == 0:
                break
            if count not in spent:
                spent[count] = rate * (costs.after_draft_s(count) / plain_s - 1.0)
            gain = share * sums[count - 1] - spent[count]
            if gain > best[0]:
                best = (gain, k, block, count, sums[count - 1])
            if count == len(sums):
                break  # a larger K keeps the same nodes
    gain, k, block, count, expects = best
    return TreeCut(RoundSetting(k, 1, block) if k else PLAIN_STEP, count, expects, gain)


def apply_cut(drafts, nodes: list[tuple[int, float]], cut: TreeCut):
    """The drafts of the cut tree: each path's kept prefix, prefixes of other kept paths left out, the nodes renumbered
    in their best-first order (``engine.accepted_with_fewer`` reads it)."""
    if cut.setting.plain:
        return replace(drafts, tokens=(), order=(), chances=())
    if cut.nodes == len(nodes):  # the whole tree: its paths and best-first numbers as drafted (``kept_paths``'s)
        return drafts
    return kept_paths(drafts, nodes, cut)


def kept_paths(drafts, nodes: list[tuple[int, float]], cut: TreeCut):
    """``apply_cut`` of a cut that keeps some of the tree's nodes: the paths through them, renumbered."""
    kept = [node for node, (depth, _) in enumerate(nodes) if depth <= cut.setting.block][: cut.nodes]
    rank = {node: r for r, node in enumerate(kept)}
    paths: dict[tuple[int, ...], tuple] = {}
    for tokens, orders, chances in zip(drafts.tokens, drafts.order, drafts.chances):
        length = next((i for i, node in enumerate(orders) if node not in rank), len(orders))
        if length:
            paths.setdefault(tuple(orders[:length]), (tokens[:length], chances[:length]))
    inner = {path[:i] for path in paths for i in range(1, len(path))}
    leaves = [path for path in paths if path not in inner]
    return replace(
        drafts,
        tokens=tuple(paths[p][0] for p in leaves),
        order=tuple(tuple(rank[n] for n in p) for p in leaves),
        chances=tuple(paths[p][1] for p in leaves),
    )


def kept_by_depth(nodes: list[tuple[int, float]], cut: TreeCut) -> list[float]:
    """The chances of the nodes a cut keeps, summed per depth 1..L: the draft tokens it expects at each depth."""
    sums = [0.0] * cut.setting.block
    for depth, chance in [(d, p) for d, p in nodes if d <= cut.setting.block][: cut.nodes]:
        sums[depth - 1] += chance
    return sums


def next_drafts(drafted: int, cut: RoundSetting) -> int:
    """K of the next round's draft tree: the K its cut kept, twice the drafted K where the cut kept all of it (wider
    trees may pay again), the same after a cut to the root alone. A tree's search costs in proportion to its nodes,
    and a round rarely keeps more branches than the one before (tune half, greedy chats: (1, 1, 8) 1.45x plain where
    auto drafting 8 x L trees every round got 1.39x)."""
    if cut.plain:
        return drafted
    return min(CHANCE_DRAFTS, 2 * drafted) if cut.drafts >= drafted else cut.drafts


class ChanceControl:
    """``auto`` for drafters whose trees carry their chances (``Drafter.offers_chances``): every drafting round drafts
    a tree of K x L nodes at T = 1 (one drafter forward whatever K; K from the cuts before, ``next_drafts``), reads
    the chances of its nodes and verifies the cut that gains most over plain steps (``best_cut``), or the root alone.
    The chances are weighed per depth by what this request's rounds accepted there (``shares``). Whether to draft at
    all is the one choice made before the chances are known: when the gain of the last drafting rounds (``round_gain``,
    ``GAIN_MEMORY``, over ``GAIN_PRIOR``) beats the draft's price, or as a probe after ``PROBE_FIRST`` plain rounds
    and more."""

    counts_fewer = False  # the chances price every cut: no counts per K

    def __init__(self, costs: CostModel, max_block: int | None, sampled: bool = False):
        self.calibrated, self.max_block = costs, auto_longest_block(max_block)
        self.prices = StagePrices()
        decline = SHARE_DECLINE_SAMPLED if sampled else SHARE_DECLINE
        self.share_priors = [SHARE_PRIOR * decline**depth for depth in range(self.max_block)]
        self.sampled = sampled
        self.reprice(MeasuredCosts(costs))  # the calibrated costs as this request's rounds measured them (``timed``)
        self.gain_weight = GAIN_WEIGHT_SAMPLED if sampled else GAIN_WEIGHT
        self.gain_memory = GAIN_MEMORY_SAMPLED if sampled else GAIN_MEMORY
        self.cut_drafts = CUT_DRAFTS_SAMPLED if sampled else CUT_DRAFTS
        self.gain_by = GAIN_BY_SAMPLED if sampled else GAIN_BY
        self.misses_needed = MISSES_SAMPLED if sampled else 0  # greedy, the gain estimate alone decides
        # Per depth 1..max_block: rounds that accepted that many draft tokens / the kept chances' sums there, decayed by
        # ``MEMORY`` in each round that verified the depth (a depth not verified learns nothing).
        self.realised, self.expected = [0.0] * self.max_block, [0.0] * self.max_block
        # Decayed sum and count of drafting rounds' promised gains, from the prior's rounds: they decay like the
        # request's own, so that drafts that keep failing wash the prior out at any draft price.
        self.gains, self.weight = self.gain_weight * GAIN_PRIOR, self.gain_weight
        self.plain_run, self.probe_after, self.probing = 0, PROBE_FIRST, False
        self.misses = 0  # drafting rounds in a row whose gain did not pay the draft's price (``MISSES_SAMPLED``)
        self.last: TreeCut | None = None  # this round's cut (None: it did not draft)
        self.kept: list[float] = []  # the cut's chances summed per depth (before the shares)
        self.drafts = min(FIRST_DRAFTS, max(self.cut_drafts))  # K of the next draft (``next_drafts``)
        self.drafted = PLAIN_STEP  # the last draft's (K, 1, L)

    def shares(self) -> list[float]:
        """Per depth: accepted per expected in this request over the depth's prior (``SHARE_PRIOR``)."""
        return [
            (r + SHARE_WEIGHT * prior) / (e + SHARE_WEIGHT)
            for r, e, prior in zip(self.realised, self.expected, self.share_priors)
        ]

    def expected_gain(self) -> float:
        return self.gains / self.weight

    def reprice(self, costs: MeasuredCosts) -> None:
        """Plan at ``costs`` from now on; the rate follows them (read several times a round, so computed once)."""
        self.costs = costs
        chain = RoundSetting(1, 1, self.max_block)
        self.rate_now = RATE_SAMPLED if self.sampled else CHAIN_TOKENS * costs.plain_s / costs.round_s(chain)

    def rate(self) -> float:
        """The rate a round's time could earn otherwise, tokens per plain step (``CHAIN_TOKENS``, ``RATE_SAMPLED``)."""
        return self.rate_now

    def round_gain(self, accepted: int) -> float:
        """The gain a drafting round counts towards the next draft: its cut's promise and what the cut realised (its
        accepted tokens less the same price), the larger one greedy, the smaller one when sampling (``GAIN_BY``)."""
        promised = self.last.gain
        if self.last.setting.plain:
            return promised
        spent = self.costs.after_draft_s(self.last.nodes) / self.costs.round_s(PLAIN_STEP) - 1.0
        return self.gain_by(promised, accepted - self.rate() * spent)

    def draft_price(self, setting: RoundSetting) -> float:
        """The draft's seconds in plain steps, times the rate they could earn otherwise (``rate``)."""
        return self.rate() * self.costs.tree_draft(setting) / self.costs.round_s(PLAIN_STEP)

    def choose(self, remaining: int) -> RoundSetting:
        self.last = None
        longest = min(self.max_block, remaining - 1)  # drafting past the reply's end gains nothing
        if longest < 1:
            return PLAIN_STEP
        setting = RoundSetting(self.drafts, 1, longest)
        below = self.expected_gain() <= self.draft_price(setting)
        self.probing = below and self.misses >= self.misses_needed
        return PLAIN_STEP if self.probing and self.plain_run < self.probe_after else setting

    def cut(self, drafts, setting: RoundSetting):
        """The drafts to verify (``best_cut`` of the drafted tree) and the round's setting (PLAIN_STEP: the root)."""
        if setting.plain:
            return drafts, setting
        nodes, self.drafted = node_chances(drafts), setting
        shares = self.shares()
        weighed = [(depth, shares[depth - 1] * chance) for depth, chance in nodes]
        cut = best_cut(weighed, setting.block, 1.0, self.costs, self.rate(), self.cut_drafts)
        self.kept = kept_by_depth(nodes, cut)
        self.last = TreeCut(cut.setting, cut.nodes, sum(self.kept), cut.gain)
        self.plain_run = 0
        self.drafts = min(max(self.cut_drafts), next_drafts(setting.drafts, self.last.setting))
        return apply_cut(drafts, nodes, self.last), self.last.setting

    def observe(self, setting: RoundSetting, accepted: int, with_fewer: tuple[int, ...] = ()) -> None:
        if self.last is None:
            self.plain_run += 1
            return
        gain = self.round_gain(accepted)
        self.gains = self.gain_memory * self.gains + gain
        self.weight = self.gain_memory * self.weight + 1.0
        paid = gain > self.draft_price(self.drafted)
        self.misses = 0 if paid else self.misses + 1
        if paid or self.probing:
            self.probe_after = PROBE_FIRST if paid else min(2 * self.probe_after, PROBE_MAX)
        if setting.plain:
            return
        for depth, kept in enumerate(self.kept):
            self.realised[depth] = MEMORY * self.realised[depth] + (accepted > depth)
            self.expected[depth] = MEMORY * self.expected[depth] + kept

    def timed(self, measured) -> None:
        """Correct the prices by the round's measured seconds (``engine.Timings``: its draft, verify and the rest): the
        draft against the drafted tree's price, the verify, walk and commit against the cut's or a plain round's."""
        rest_s = measured.verify_s + measured.other_s
        if self.last is None or not self.last.nodes:  # a plain round, or a draft cut to the root alone
            self.prices.add("plain", rest_s, self.calibrated.round_s(PLAIN_STEP))
        else:
            self.prices.add("rest", rest_s, self.calibrated.after_draft_s(self.last.nodes))
        if self.last is not None:
            self.prices.add("draft", measured.draft_s, self.calibrated.tree_draft(self.drafted))
        self.reprice(MeasuredCosts(self.calibrated, **self.prices.ratios()))
