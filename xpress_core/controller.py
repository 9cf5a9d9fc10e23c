"""How much to speculate, round by round (docs/DESIGN.md §2.6): a fixed (K, T, L), or ``auto``: a fixed setting chosen
at load by what these models and this machine measured (``choose_setting``, ``engine.chosen_setting``,
``ChosenControl``), for drafters whose drafts carry no tree of chances the counting model (``counting.py``). The rounds'
settings and their prices (``CostModel``). Whatever is chosen, the output is the target's: the controller only changes
what is drafted, and the acceptance walk decides what is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from .config import DecodeConfig

AUTO_MAX_BLOCK = 16  # the longest L it may pick (the drafter's own limit may be lower)
# Plain rounds before a probe (the counting model's, and ``ChosenControl``'s where the load chose plain steps), doubling
# after each probe that does not pay. A probe costs what a drafting round costs and, where drafting did not pay, finds
# it still does not: after 16 plain rounds rather than 4, sampled stories gained 3.6 % and sampled chats 1.2 % (the
# counting model, a replay at fixed prices of 50 chats, 20 short chats and 10 stories; greedy the same).
FIRST_PROBE, LAST_PROBE = 16, 64
# Speculate only when the best setting's expected rate beats a plain step's by this factor (for a setting chosen at
# load: draft, or verify more nodes, only when that beats the best with fewer by it, ``choose_setting``). The best of
# some fifty estimates is optimistic (the largest of noisy numbers), and a near-even bet still costs: measured on
# held-out chats at temperature 0.7, speculative rounds ran 1.0-1.15x their calibrated cost, plain steps 1.0x (the
# embedded pair since its plain steps run ATen's kernels: priced 3.0-4.3 ms, 2.5-3.4 ms in decoding; stop 68).
SPECULATE_MARGIN = 1.05
# How many of the choice's replayed rounds a request's own drafting rounds are counted with (``DraftingWorth.rate``):
# a replay of SmolLM2's README prompts at 0.7 put 2, 4, 8 and 16 at 1.080, 1.078, 1.067 and 1.061x plain (stop 70).
REQUEST_PRIOR = 4.0


@dataclass(frozen=True)
class RoundSetting:
    drafts: int  # K
    steps: int  # T
    block: int  # L; 0 = a plain step (no drafting)

    @property
    def plain(self) -> bool:
        return self.block == 0

    @property
    def nodes(self) -> int:
        """Draft tokens the round's tree verifies (K x L)."""
        return self.drafts * self.block

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.drafts, self.steps, self.block)


PLAIN_STEP = RoundSetting(0, 0, 0)


def denoise_work(setting: RoundSetting) -> tuple[int, int]:
    """A diffusion drafter's work in a round: T forwards, each over K x (L + 1) positions (every draft row), as
    (forwards, positions over all of them)."""
    return setting.steps, setting.steps * setting.drafts * (setting.block + 1)


def no_passes(setting: RoundSetting) -> int:
    """Refinement passes a drafter without a refiner head runs: none (its T counts denoise steps)."""
    return 0


@dataclass(frozen=True)
class CostModel:
    """Seconds of a round's stages, linear in their work, the verify in two pieces (fitted by ``engine.calibrate``)."""

    draft_forward_s: float  # one drafter forward, fixed part
    draft_position_s: float  # per block position a drafter forward computes (K x (L + 1) for K rows of L tokens)
    verify_forward_s: float  # one target forward, fixed part
    verify_token_s: float  # one target forward, per token (the root and every tree node)
    other_s: float  # acceptance, commit and stop checks
    # A forward over drafts costs this much more than the tokens' share says: on a CPU the kernels for several tokens
    # cost a step more than the one-token ones (bf16, embedded target: 5 tokens 1.16x a one-token forward, 33 tokens
    # 1.33x), which a line through 1 and 33 tokens puts at 1.04x. Plain steps do not pay it.
    verify_draft_s: float = 0.0
    # Past ``verify_wide`` drafted tokens each one costs ``verify_wide_token_s``: wider forwards cost more per token on a
    # CPU (bf16, embedded target, against a one-token forward: 5 tokens 1.08-1.15x, 33 tokens 1.25-1.28x, 65 tokens
    # 1.60-1.68x), which the line through 5 and 33 tokens put at 1.4x; the trees auto may pick reach 64 tokens.
    # 0: one slope throughout.
    verify_wide: int = 0
    verify_wide_token_s: float = 0.0
    # The drafter's forwards in a round and the positions they compute in all (``Drafter.draft_work``).
    draft_work: Callable[[RoundSetting], tuple[int, int]] = denoise_work
    # A refinement pass (refiner.py) and how many a round runs (``Drafter.refine_passes``).
    pass_s: float = 0.0
    refine_passes: Callable[[RoundSetting], int] = no_passes
    # A drafting round's acceptance over its tree, commit, and the controller's new search (a drafting round changes
    # its counts; a run of plain rounds reuses one search). 0: ``other_s``. Measured in decoding: 0.31 ms where a
    # plain round's acceptance and commit cost 0.13 ms.
    draft_other_s: float = 0.0
    # ``auto``'s fixed settings, chosen at load on these costs (``engine.chosen_setting``); None: not chosen.
    chosen: SettingChoice | None = None

    def round_s(self, setting: RoundSetting) -> float:
        """Seconds of a round; a tree of K drafts of L tokens has at most K x L nodes (branching keeps them apart)."""
        if setting.plain:
            return self.verify_s(0) + self.other_s
        return self.drafting_s(setting) + self.after_draft_s(setting.nodes)

    def verify_s(self, nodes: int) -> float:
        """Seconds of the verify forward over the root and ``nodes`` drafted nodes (none: a plain step's forward)."""
        verify = self.verify_forward_s + self.verify_token_s * (nodes + 1)
        if self.verify_wide and nodes > self.verify_wide:
            verify += (self.verify_wide_token_s - self.verify_token_s) * (nodes - self.verify_wide)
        return verify + (self.verify_draft_s if nodes else 0.0)

    def after_draft_s(self, nodes: int) -> float:
        """Seconds of a drafting round past its draft: the verify over ``nodes`` nodes, the walk, commit and search."""
        return self.verify_s(nodes) + (self.draft_other_s or self.other_s)

    def drafting_s(self, setting: RoundSetting) -> float:
        """Seconds of the draft at (K, T, L): its forwards, positions and refinement passes as the drafter declares."""
        forwards, positions = self.draft_work(setting)
        drafting = forwards * self.draft_forward_s + positions * self.draft_position_s
        return drafting + self.refine_passes(setting) * self.pass_s


def auto_longest_block(max_block: int | None) -> int:
    """The longest L ``auto`` may pick for a drafter whose own limit is ``max_block`` (None: none)."""
    return min(AUTO_MAX_BLOCK, max_block or AUTO_MAX_BLOCK)


class FixedControl:
    """Every round at the request's own (K, T, L)."""

    counts_fewer = False  # ``observe`` ignores what fewer drafts would have accepted: the engine need not work it out

    def __init__(self, cfg: DecodeConfig):
        self.setting = RoundSetting(cfg.drafts, cfg.steps, cfg.block)

    def choose(self, remaining: int) -> RoundSetting:
        return self.setting

    def to_verify(self, drafts):
        """The part of the round's drafts the verify runs on: all of them."""
        return drafts

    def observe(self, setting: RoundSetting, accepted: int, with_fewer: tuple[int, ...] = ()) -> None:
        pass

    def timed(self, measured) -> None:
        pass


# auto's candidates (``engine.chosen_setting``): K drafts of the drafter's longest block (up to ``AUTO_MAX_BLOCK``), at
# every T it may pick. A round's tokens grow with its tree's nodes about as fast as the verify's cost on our CPU (lab
# log, issue 48 stop 56: 8 nodes tau 3.24, 16 nodes 3.56 on held chats); 8 drafts (64 nodes) never led a run.
CHOSEN_DRAFTS = (1, 2, 4)
# T among them: one. Chosen on the calibrated prices, refinement passes (T = 2) lost to the best T = 1 tree in real
# time on the held-out classes (embedded pair, 2 threads, bf16: greedy (4, 2, 8) 0.945x (2, 1, 8), at 0.7 (1, 2, 8)
# 0.92x (1, 1, 8)): a pass took 1.1-1.5 ms in decoding where the calibration priced 0.7 (lab log, "auto's stop rule
# retired"). Refinement stays a pinned setting.
CHOSEN_STEPS = (1,)


def candidate_settings(max_block: int | None, steps: tuple[int, ...]) -> tuple[RoundSetting, ...]:
    """The settings ``auto`` chooses among at load: K in ``CHOSEN_DRAFTS`` at the longest block, each T of ``steps``."""
    block = auto_longest_block(max_block)
    return tuple(RoundSetting(k, t, block) for t in steps if t <= block for k in CHOSEN_DRAFTS)


def setting_name(setting: RoundSetting) -> str:
    return "plain" if setting.plain else "{}x{}x{}".format(*setting.as_tuple())


@dataclass(frozen=True)
class RecordedRound:
    """A drafting round at the widest candidate, as ``choose_setting`` replays it: its tree's nodes' path chances in
    the order the drafter chose them (``path_chances``), and the places in that order of the nodes it accepted."""

    chances: tuple[float, ...]
    accepted: tuple[int, ...]


def path_chances(orders: Sequence[Sequence[int]], chances: Sequence[Sequence[float]]) -> list[float]:
    """Each node's chance of being reached and accepted (its path's own chances multiplied), best first: read off a
    tree's paths (``Drafts.order``, ``Drafts.chances``), where a node shared by several paths appears in each."""
    by_order: dict[int, float] = {}
    for path_orders, own in zip(orders, chances):
        chance = 1.0
        for order, c in zip(path_orders, own):
            chance *= c
            by_order[order] = chance
    return [by_order[o] for o in sorted(by_order)]


def nodes_worth_verifying(chances: Sequence[float], costs: CostModel, share: float = 1.0) -> int:
    """How many of a tree's best-first nodes (``chances``: their path chances, each times ``share``, at most 1) to
    verify: the count whose expected accepted tokens (the sum) most exceed the verify's seconds beyond a plain step's,
    counted in the tokens plain steps write in them; 0, the root alone (a plain step). The draft is paid either way.

    Why: on SmolLM2 (bf16, 2 threads) a plain step took 24 ms and a (1, 1, 8) round 38.6 ms, 4.9 of them drafting,
    while its chain emitted 1.44 tokens a round on new stories: 0.85x plain decoding. The drafter's chances tell a
    sure block from a guess (greedy, a node whose path chance is under 0.1 was accepted in 17 % of the rounds that
    reached it, over 0.9 in 98 %), and a replay of the 60 held prompts' rounds at their measured prices put this cut
    at 1.26x plain decoding greedy against the whole chain's 1.07x (lab log, "auto verifies what its chances pay")."""
    plain_s = costs.round_s(PLAIN_STEP)
    best, count, expected = 0.0, 0, 0.0
    for n, chance in enumerate(chances, start=1):
        expected += min(1.0, chance * share)
        gain = expected - (costs.after_draft_s(n) - plain_s) / plain_s
        if gain > best:
            best, count = gain, n
    return count


def chance_share(rounds: Sequence[RecordedRound], nodes: int) -> float:
    """Draft tokens the recorded rounds accepted among their trees' first ``nodes`` nodes per token those nodes' path
    chances expected (1 without any): what a chance is worth in this mode. Why: greedy chances are the drafter's
    sharpened softmax, which says how sure it is of its token, not how often the target agrees; sampled ones are the
    coupled scores'. On SmolLM2's held prompts (the (1, 1, 8) chain) greedy rounds accepted 1.73x what the chances
    expected and sampled ones 0.66x, and a replay of those rounds at their measured prices cut with the chances times
    1.73 ran 1.180x plain decoding greedy where the chances as they are ran 1.142x (sampled: level either way)."""
    expected = sum(sum(r.chances[:nodes]) for r in rounds)
    accepted = sum(sum(order < nodes for order in r.accepted) for r in rounds)
    return accepted / expected if expected > 0 else 1.0


def replayed(
    rounds: Sequence[RecordedRound], setting: RoundSetting, costs: CostModel, share: float = 1.0
) -> tuple[int, float, int]:
    """Tokens, priced seconds and verified nodes of the recorded rounds, had each drafted ``setting``'s tree (the first
    K x L nodes of the widest: ``best_first_paths``) and verified what ``nodes_worth_verifying`` keeps of it."""
    tokens, seconds, nodes = 0, 0.0, 0
    for r in rounds:
        n = nodes_worth_verifying(r.chances[: setting.nodes], costs, share)
        tokens += 1 + sum(order < n for order in r.accepted)  # the accepted path's nodes come in that order
        seconds += costs.drafting_s(setting) + (costs.after_draft_s(n) if n else costs.round_s(PLAIN_STEP))
        nodes += n
    return tokens, seconds, nodes


def choose_setting(
    rounds: Sequence[RecordedRound], candidates: Sequence[RoundSetting], costs: CostModel
) -> tuple[RoundSetting, dict]:
    """The setting with the most tokens per calibrated second on the recorded rounds (``replayed``), or a plain step
    where none beats one; taken in order of drafted nodes from a plain step, a setting replaces the narrower one
    chosen so far only where it beats it by ``SPECULATE_MARGIN``; and the figures that chose it (per setting: tau,
    round ms, tokens/s, nodes verified a round, the chances' share it cut with: ``chance_share``). A pure function of
    the recorded rounds and the costs.

    Why the margin: on SmolLM2 (2, 1, 8) was expected at 1.000x and 1.003x (1, 1, 8) and ran 0.982x and 0.972x it in
    the bench (stops 63, 64), and on the embedded pair's held text a wide choice ran 0.87-0.88x (1, 1, 8) (issue 58):
    an estimate within a few per cent of a narrower one's is a near-even bet that the wider verify loses. Against a
    plain step too (as the counting model, ``AutoControl``): SmolLM2's sampled (1, 1, 8), expected at 1.03x plain
    steps, ran 0.99x them over 60 held prompts and 0.90x on new stories (stop 68); the embedded pair's sampled
    choices are expected at 1.1-1.4x plain."""
    plain_s = costs.round_s(PLAIN_STEP)
    figures = {"plain": {"tau": 1.0, "round_ms": 1000 * plain_s, "tokens_per_s": 1.0 / plain_s}}
    best, best_rate = PLAIN_STEP, 1.0 / plain_s
    for setting in sorted(candidates, key=lambda s: (s.nodes, s.steps)):
        if not rounds:
            break
        share = chance_share(rounds, setting.nodes)
        tokens, seconds, nodes = replayed(rounds, setting, costs, share)
        rate, count = tokens / seconds, len(rounds)
        figures[setting_name(setting)] = {
            "tau": tokens / count,
            "round_ms": 1000 * seconds / count,
            "tokens_per_s": rate,
            "nodes": nodes / count,
            "share": share,
        }
        if rate > best_rate * SPECULATE_MARGIN:
            best, best_rate = setting, rate
    return best, figures


def confirmed(setting: RoundSetting, drafting: tuple[int, float], plain: tuple[int, float]) -> RoundSetting:
    """``setting`` where decoding at it wrote tokens faster than plain steps by ``SPECULATE_MARGIN`` on the same
    requests ((tokens, seconds) of each, ``engine.decoded_in_turns``), else a plain step. Why: the replay's prices
    and requests can both flatter drafting. On the embedded pair's held text at 0.7 the sampled (1, 1, 8) chosen at
    1.15x expected ran 0.89x plain decoding: its drafting rounds cost 1.1-1.4x more against plain steps in decoding than
    priced, and its requests accepted more than the held text (tau 2.33 against 2.08; lab log, stop 69)."""
    ratio = speed_ratio(drafting, plain)
    return setting if setting.plain or ratio is None or ratio >= SPECULATE_MARGIN else PLAIN_STEP


def speed_ratio(drafting: tuple[int, float], plain: tuple[int, float]) -> float | None:
    """Tokens per second of one (tokens, seconds) over another's; None where either wrote nothing or took no time."""
    if min(drafting[1], plain[0], plain[1]) <= 0:
        return None
    return drafting[0] * plain[1] / (drafting[1] * plain[0])


MODES = ("greedy", "sampled")  # auto's two choices: greedy decoding and sampling (``SettingChoice``)


def drafting_name(setting: RoundSetting, figures: dict) -> str | None:
    """The drafting setting a mode's figures speak for: the one chosen; where plain steps won, the one decoding turned
    down (``confirmed``), else the best the replay found; None where the figures hold none."""
    drafting = {name: f for name, f in figures.items() if name != "plain"}
    if "plain" not in figures or not drafting:
        return None
    if not setting.plain:
        return setting_name(setting)
    tried = [n for n, f in drafting.items() if "decoded_over_plain" in f]
    return tried[0] if tried else max(drafting, key=lambda n: drafting[n]["tokens_per_s"])


def chosen_text(setting: RoundSetting, figures: dict) -> str:
    """One mode's choice in its figures' terms (``SettingChoice.summary``): the drafting setting's tau over its round
    in plain steps, and its expected rate over plain decoding; for plain steps, the drafting setting they probe with."""
    name = drafting_name(setting, figures)
    if name is None:
        return setting_name(setting)
    f, plain = figures[name], figures["plain"]
    expected = (
        f"tau {f['tau']:.2f} a round of {f['round_ms'] / plain['round_ms']:.2f} plain steps, "
        f"{f['tokens_per_s'] / plain['tokens_per_s']:.2f}x plain decoding expected"
    )
    if "decoded_over_plain" in f:  # ``confirmed``
        expected += f", {f['decoded_over_plain']:.2f}x decoded"
    if setting.plain:
        return f"plain steps, drafting {name} where a request's own rounds pay ({expected})"
    return f"{name} ({expected})"


@dataclass(frozen=True)
class DraftingWorth:
    """A mode's drafting setting as the choice at load measured it on its requests (``SettingChoice.worth``)."""

    setting: RoundSetting
    share: float  # what a chance is worth (``chance_share``)
    tau: float  # tokens a round, replayed with the cut
    steps: float  # a round's price in plain steps, replayed
    bias: float  # its rate over plain steps as decoded, over that at the prices (1 where not decoded)

    def rate(self, tokens: float, steps: float) -> float:
        """Drafting's rate over plain steps' once a request's own drafting rounds wrote ``tokens`` for ``steps``
        priced plain steps, counted with ``REQUEST_PRIOR`` rounds as the choice's requests replayed them."""
        return self.bias * (tokens + REQUEST_PRIOR * self.tau) / (steps + REQUEST_PRIOR * self.steps)


@dataclass(frozen=True)
class SettingChoice:
    """``auto``'s fixed settings on these models and this machine, greedy and sampled (``choose_setting``), with the
    figures that chose them; ``reason`` says where they were measured."""

    greedy: RoundSetting
    sampled: RoundSetting
    figures: dict  # per mode ("greedy", "sampled"): ``choose_setting``'s figures
    reason: str = "measured at load"

    def setting(self, sampled: bool) -> RoundSetting:
        return self.sampled if sampled else self.greedy

    def share(self, sampled: bool) -> float:
        """What a chance is worth for the setting chosen in this mode (its figures' ``chance_share``; 1 where none)."""
        mode = "sampled" if sampled else "greedy"
        return self.figures.get(mode, {}).get(setting_name(self.setting(sampled)), {}).get("share", 1.0)

    def worth(self, sampled: bool) -> DraftingWorth | None:
        """The mode's drafting setting (``drafting_name``: where plain steps won, the one that lost) as measured; None
        where the figures hold none."""
        figures = self.figures.get("sampled" if sampled else "greedy", {})
        name = drafting_name(self.setting(sampled), figures)
        if name is None:
            return None
        f, plain = figures[name], figures["plain"]
        expected = f["tokens_per_s"] / plain["tokens_per_s"]
        setting = RoundSetting(*(int(n) for n in name.split("x")))
        steps = f["round_ms"] / plain["round_ms"]
        return DraftingWorth(
            setting, f.get("share", 1.0), f["tau"], steps, f.get("decoded_over_plain", expected) / expected
        )

    def to_json(self) -> dict:
        settings = {mode: self.setting(mode == "sampled").as_tuple() for mode in MODES}
        return {"settings": settings, "figures": self.figures, "reason": self.reason}

    def summary(self) -> str:
        """What auto runs here and why, in the chosen figures' own terms, greedy and sampled: the setting's tau over
        its round's price in plain steps, and where plain steps won, the best drafting setting's expected rate. Why
        said: on a CPU where a verify over 9 tokens costs 1.8 plain steps (SmolLM2 in fp32 without AVX-512) auto
        decodes plainly, and a user who sees no draft should read that it was measured, not broken."""
        parts = [f"{mode} {chosen_text(self.setting(mode == 'sampled'), self.figures.get(mode, {}))}" for mode in MODES]
        return f"{'; '.join(parts)} ({self.reason})"

    @classmethod
    def from_json(cls, entry: dict, reason: str) -> SettingChoice:
        settings = {mode: RoundSetting(*entry["settings"][mode]) for mode in MODES}
        return cls(**settings, figures=entry["figures"], reason=reason)


class ChosenControl(FixedControl):
    """``auto`` where the drafter's trees carry their chances: rounds draft the setting chosen at load, its block
    cut where the reply ends sooner, and verify the best-first nodes its chances pay for (``nodes_worth_verifying``:
    none, a plain step, where the draft is a guess). With its ``worth`` as measured at load, a request drafts while
    its own drafting rounds, counted with the load's (``DraftingWorth.rate``), beat plain steps by ``SPECULATE_MARGIN``;
    else it steps plainly, drafting a probe at its first round and after ``FIRST_PROBE`` plain steps, doubling to
    ``LAST_PROBE``. Where the load turned drafting down, text its drafter suits still gets it: at 0.7 plain steps ran
    0.82-0.85x (1, 1, 8) on the embedded pair's SGD chats and 0.92-0.95x the best fixed on SmolLM2's held chats (stop
    69); with probes, on the design sets in real time, 1.03-1.09x and 1.01-1.03x the plain steps (stop 70). Modes that
    chose drafting keep it, whatever a round accepts (a stop rule lost 2-5 % on SmolLM2, stops 54-61). Without a
    ``worth`` (the choice's own decodes) every round drafts."""

    def __init__(
        self,
        setting: RoundSetting,
        costs: CostModel | None = None,
        share: float = 1.0,
        worth: DraftingWorth | None = None,
    ):
        self.setting, self.costs, self.share, self.worth = setting, costs, share, worth
        self.tokens, self.steps = 0.0, 0.0  # this request's drafting rounds: tokens written, price in plain steps
        self.plain_run, self.probe_after = 0, 0
        self.verified: int | None = None  # nodes the last round's cut kept (None: not cut, all of them)

    @classmethod
    def of(cls, choice: SettingChoice, sampled: bool, costs: CostModel) -> ChosenControl:
        """A mode's choice: its setting; where that is plain steps, its figures' drafting setting with its ``worth``."""
        setting = choice.setting(sampled)
        worth = choice.worth(sampled) if setting.plain else None
        if worth is None:
            return cls(setting, costs, choice.share(sampled))
        return cls(worth.setting, costs, worth.share, worth)

    def choose(self, remaining: int) -> RoundSetting:
        block = min(self.setting.block, remaining - 1)  # drafting past the reply's end gains nothing
        if self.setting.plain or block < 1 or not self.drafts_now():
            return PLAIN_STEP
        return replace(self.setting, steps=min(self.setting.steps, block), block=block)

    def drafts_now(self) -> bool:
        """Whether this round drafts: always without a ``worth``; else where drafting pays so far, or a probe is due."""
        if self.worth is None:
            return True
        if self.worth.rate(self.tokens, self.steps) >= SPECULATE_MARGIN:
            self.probe_after = FIRST_PROBE
            return True
        if self.plain_run < self.probe_after:
            return False
        self.probe_after = min(max(FIRST_PROBE, 2 * self.probe_after), LAST_PROBE)
        return True

    def observe(self, setting: RoundSetting, accepted: int, with_fewer: tuple[int, ...] = ()) -> None:
        """With a ``worth``: a drafting round's tokens and price in plain steps (its draft, and the verify over the
        nodes it kept, or a plain step's); a plain round lengthens the run of them."""
        if self.worth is None:  # the counts feed ``drafts_now`` only: a drafting round pays none of this
            return
        if setting.plain:
            self.plain_run += 1
            return
        self.plain_run = 0
        plain_s = self.costs.round_s(PLAIN_STEP)
        nodes = setting.nodes if self.verified is None else self.verified
        rest_s = self.costs.after_draft_s(nodes) if nodes else plain_s
        self.tokens += accepted + 1
        self.steps += (self.costs.drafting_s(setting) + rest_s) / plain_s

    def to_verify(self, drafts):
        """The drafts cut to their first ``nodes_worth_verifying`` nodes in best-first order (a tree's ancestors come
        before their children, so every path keeps a prefix), and the watched step that shows them (a panel's last
        frame is the tree verified); as they are without prices or chances."""
        if self.costs is None or not drafts.order:
            return drafts
        count = nodes_worth_verifying(path_chances(drafts.order, drafts.chances), self.costs, self.share)
        self.verified = count
        kept = [sum(order < count for order in orders) for orders in drafts.order]

        def cut(rows):
            return tuple(row[:length] for row, length in zip(rows, kept) if length)

        steps = drafts.steps
        if steps and steps[-1].tokens == drafts.tokens:
            steps = (*steps[:-1], replace(steps[-1], tokens=cut(drafts.tokens), confidence=cut(drafts.chances)))
        return replace(
            drafts, tokens=cut(drafts.tokens), steps=steps, order=cut(drafts.order), chances=cut(drafts.chances)
        )
