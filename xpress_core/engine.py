"""The decoding loop: prefill -> (draft -> tree -> verify -> accept -> commit)*, yielding one event per round.

State between rounds (docs/DESIGN.md §2): the committed tokens are the prompt plus ``output``; the target cache holds
all of them but the last one, the *root*, which enters the cache with the next verify forward. The drafter's context
holds exactly what the target cache holds. Before each round the settings' control (``controller.py``) says what to
draft: a fixed (K, T, L), or ``auto``'s choice.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from . import cache as kv
from .config import DecodeConfig
from .controller import AUTO_DRAFTS, AutoControl, CostModel, FixedControl, RoundSetting, auto_longest_block
from .drafters.base import DraftRandomness, Drafts, NoDrafter
from .errors import XpressError
from .models import Models, context_limit, eos_ids
from .sampling import TargetNoise, draw_token
from .trace import DecodeResult, RoundTrace, StageClock, peak_memory_mb
from .tree import Acceptance, DraftTree, accept, build_tree
from .verify import VERIFIERS, Verified, target_forward


@dataclass
class DecodeState:
    """Per-request mutable state: what decoding needs and running totals, never shared between requests.

    The rounds themselves are not kept: a caller that wants them reads the events ``decode`` yields.
    """

    cache: object
    draft_state: object
    root: int
    output: list[int]
    noise: TargetNoise  # the target's draws (sampling.py)
    drafter_rng: torch.Generator
    prompt_len: int
    forwards: int = 1  # target forwards so far (the prefill is the first)
    accept_lens: list[int] = field(default_factory=list)  # per drafting round
    settings: list[tuple[int, int, int]] = field(default_factory=list)  # per drafting round: (K, T, L)
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0


def wait_for_gpus(devices=None) -> None:
    """Wait for the queued work of the CUDA devices given (``Models.cuda_devices``: a target spread over GPUs runs
    on all of them), every visible one when none are given."""
    for device in range(torch.cuda.device_count()) if devices is None else devices:
        torch.cuda.synchronize(device)


class Clock:
    """Wall clock that waits for queued CUDA work first, so timings are real, and that stops while the consumer
    holds a yielded event. What ``calibrate`` times its stages with; a round marks its stages on a ``StageClock``,
    which waits once a round."""

    def __init__(self, device: torch.device, devices=None):
        self.cuda, self.devices = device.type == "cuda", devices
        self.excluded = 0.0

    def raw(self) -> float:
        if self.cuda:
            wait_for_gpus(self.devices)
        return time.perf_counter()

    def now(self) -> float:
        return self.raw() - self.excluded

    @contextmanager
    def paused(self):
        t = self.raw()
        yield
        self.excluded += self.raw() - t


def stop_token_ids(models: Models) -> set[int]:
    return eos_ids(models.target, models.tokenizer)


def prefill(models: Models, prompt_ids: torch.Tensor, cfg: DecodeConfig) -> tuple[DecodeState, int]:
    """Run the prompt (1, n) through the target; its last logits give the first new token (no drafting before
    it). The prompt may be on the host: it goes to the device in a copy that does not wait."""
    device = models.device
    cache = kv.new_cache(models.target)
    ids = prompt_ids.to(device, non_blocking=True)
    positions = torch.arange(prompt_ids.shape[1], device=device)[None]
    logits, features = target_forward(models, ids, positions, None, cache, last_only=True)
    kv.check_cache_supported(cache)
    noise = TargetNoise(torch.Generator(device=device).manual_seed(cfg.seed), logits.shape[-1])
    drafter_rng = torch.Generator(device=device).manual_seed(cfg.seed + 1)
    first = draw_token(logits[0, -1], cfg, noise)
    draft_state = models.drafter.start(prompt_ids, None if features is None else features[0])
    state = DecodeState(cache, draft_state, first, [], noise, drafter_rng, prompt_ids.shape[1])
    return state, first


def control(models: Models, cfg: DecodeConfig, costs: CostModel | None) -> FixedControl | AutoControl:
    if not cfg.auto:
        return FixedControl(cfg)
    can_draft = not isinstance(models.drafter, NoDrafter)
    return AutoControl(
        costs or models.costs or calibrate(models),
        models.drafter.max_block,
        can_draft,
        sampled=not cfg.greedy,
        steps=models.drafter.auto_steps,
        pass_gains=models.drafter.pass_gains,
    )


def round_config(cfg: DecodeConfig, setting: RoundSetting) -> DecodeConfig:
    """The request's config at this round's (K, T, L)."""
    if (cfg.drafts, cfg.steps, cfg.block) == setting.as_tuple():
        return cfg
    return replace(cfg, drafts=setting.drafts, steps=setting.steps, block=setting.block)


def draft(models: Models, state: DecodeState, cfg: DecodeConfig, setting: RoundSetting, watch: bool) -> Drafts:
    """The round's drafts; when sampling (coupled drafts), the drafter sees the noise of the target's next L draws
    (sampling.py)."""
    if setting.plain:
        return Drafts(tokens=())
    coupled = not cfg.greedy and cfg.sampled_drafts == "coupled"
    upcoming = state.noise.upcoming(setting.block) if coupled else None
    randomness = DraftRandomness(state.drafter_rng, upcoming)
    return models.drafter.draft(state.draft_state, state.root, round_config(cfg, setting), randomness, watch)


def commit(models: Models, state: DecodeState, tree: DraftTree, verified: Verified, acceptance: Acceptance, verifier):
    """The root and the accepted nodes enter the caches (their features go to the drafter); the target's own token
    becomes the new root."""
    kept_nodes = [0, *acceptance.path]
    features = verifier.keep(state.cache, verified, kept_nodes)
    models.drafter.commit(state.draft_state, [tree.tokens[n] for n in kept_nodes], features)
    state.root = acceptance.bonus


def output_limit(models: Models, state: DecodeState, cfg: DecodeConfig) -> int:
    """The most new tokens this request may have: ``max_new_tokens``, or less where the target's context ends."""
    room = context_limit(models.target)
    return cfg.max_new_tokens if room is None else min(cfg.max_new_tokens, room - state.prompt_len)


def finish(models: Models, state: DecodeState, emitted: list[int], cfg: DecodeConfig, eos: set[int]):
    """Append this round's tokens up to the first stop condition -> (tokens kept, stop reason or None)."""
    limit = output_limit(models, state, cfg)
    kept = []
    for token in emitted:
        kept.append(token)
        state.output.append(token)
        if token in eos:
            return kept, "eos"
        if cfg.stop and stop_string_hit(models.tokenizer, state.output, cfg.stop):
            return kept, "stop_string"
        if len(state.output) >= limit:
            return kept, "max_new_tokens" if limit == cfg.max_new_tokens else "context_full"
    return kept, None


def stop_string_hit(tokenizer, output: list[int], stops: tuple[str, ...]) -> bool:
    tail = tokenizer.decode(output[-(max(map(len, stops)) + 4) :], skip_special_tokens=True)
    return any(s in tail for s in stops)


def accepted_with_fewer(
    drafts: Drafts, tree: DraftTree, acceptance: Acceptance, setting: RoundSetting
) -> tuple[int, ...]:
    """Per k = 1..K, the tokens this round would have accepted with k drafts (``auto`` learns fewer drafts from it):
    the longest of the first k drafts' accepted lengths; for a tree's drafts, its accepted nodes among the first
    k x L the drafter chose, which are the tree of k x L nodes (``best_first_paths``). None for a tree refined along
    its paths: a smaller tree's passes would have read other paths, so its nodes are not the first of this one's."""
    if drafts.order and drafts.refinement is not None:
        return ()
    if not drafts.order:
        lens = acceptance.draft_accept_lens
        return tuple(max(lens[:k]) for k in range(1, len(lens) + 1))
    order = {node: o for path, orders in zip(tree.draft_paths, drafts.order) for node, o in zip(path, orders)}
    return tuple(sum(order[n] < k * setting.block for n in acceptance.path) for k in range(1, setting.drafts + 1))


def cut_drafts(drafts: tuple[tuple[int, ...], ...], models: Models, state: DecodeState) -> list[list[int]]:
    """Near the end of the target's context, shorten drafts so no position exceeds it."""
    limit = context_limit(models.target)
    room = None if limit is None else limit - (kv.cache_length(state.cache) + 1)
    return [list(d[:room]) for d in drafts]


def check_prompt(models: Models, prompt_ids: torch.Tensor) -> None:
    n = prompt_ids.shape[1]
    if n == 0:
        raise XpressError("the prompt is empty")
    limit = context_limit(models.target)
    if limit is not None and n >= limit:
        raise XpressError(f"the prompt has {n} tokens; the target's context holds {limit} (including the reply)")


def decode(
    models: Models, prompt_ids: torch.Tensor, cfg: DecodeConfig, watch: bool = False, costs: CostModel | None = None
) -> Iterator[RoundTrace | DecodeResult]:
    """Yield one ``RoundTrace`` per round (round 0 is the prefill), then one ``DecodeResult``.

    ``watch``: the events carry the drafter's denoise steps (for the visualizer); without it drafting builds no
    per-step lists and the events carry none. ``costs``: the stage costs ``auto`` plans with (default: the models',
    or measured now: a caller that serves many requests keeps ``calibrated(models)``).
    """
    cfg.validate()
    if not cfg.auto:
        models.drafter.check_block(cfg)
    check_prompt(models, prompt_ids)
    clock, eos, verifier = StageClock(models.device), stop_token_ids(models), VERIFIERS[cfg.verify]
    settings = control(models, cfg, costs)
    for device in models.cuda_devices:
        torch.cuda.reset_peak_memory_stats(device)
    # Autograd is off for each stretch of work, not across the yields: the consumer keeps its own mode between events,
    # and whichever thread resumes the generator (the app resumes it on Gradio's worker threads) runs without it.
    with torch.no_grad():
        start, begun = clock.now(), clock.mark()
        state, first = prefill(models, prompt_ids, cfg)
        kept, reason = finish(models, state, [first], cfg, eos)
        (prefill_s,) = clock.seconds(begun, clock.mark())
    with clock.paused():
        yield record(models, state, kept, Timings(0.0, prefill_s, 0.0, clock.now() - start))
    while reason is None:  # a round waits for the device three times: the drafts, the target's draws, the clock
        with torch.no_grad():
            t0 = clock.mark()
            setting = settings.choose(output_limit(models, state, cfg) - len(state.output))
            drafts = draft(models, state, cfg, setting, watch)
            t1 = clock.mark()
            tree = build_tree(state.root, cut_drafts(drafts.tokens, models, state))
            verified = verifier.verify(models, state, tree)
            t2 = clock.mark()
            acceptance = accept(tree, verified.node_logits, cfg, state.noise, verified.depths)
            commit(models, state, tree, verified, acceptance, verifier)
            settings.observe(setting, len(acceptance.path), accepted_with_fewer(drafts, tree, acceptance, setting))
            emitted = [tree.tokens[n] for n in acceptance.path] + [acceptance.bonus]
            kept, reason = finish(models, state, emitted, cfg, eos)
            timings = Timings(*clock.seconds(t0, t1, t2, clock.mark()), clock.now() - start)
        with clock.paused():
            yield record(models, state, kept, timings, drafts, tree, acceptance, setting)
    yield result(models, state, cfg, prefill_s, reason, clock.now() - start)


def decode_to_end(models: Models, prompt_ids: torch.Tensor, cfg: DecodeConfig) -> DecodeResult:
    """Run a request for its result only (rounds are not kept): for callers that do not watch the rounds."""
    for event in decode(models, prompt_ids, cfg):
        pass
    return event  # decode() always ends with its DecodeResult


@dataclass(frozen=True)
class Timings:
    draft_s: float
    verify_s: float
    other_s: float
    elapsed_s: float


def record(
    models: Models,
    state: DecodeState,
    kept: list[int],
    timings: Timings,
    drafts=None,
    tree=None,
    acceptance=None,
    setting: RoundSetting | None = None,
) -> RoundTrace:
    """The round's event, and the running totals of the request; the prefill round (index 0) has no drafts, tree or
    acceptance."""
    if acceptance is not None:
        state.forwards += 1
        state.accept_lens.append(len(acceptance.path))
        state.settings.append(setting.as_tuple())
        state.draft_s += timings.draft_s
        state.verify_s += timings.verify_s
        state.other_s += timings.other_s
    return RoundTrace(
        index=len(state.accept_lens) if acceptance else 0,
        steps=drafts.steps if drafts else (),
        drafts=drafts.tokens if drafts else (),
        tree_tokens=tree.tokens if tree else (),
        tree_parents=tree.parents if tree else (),
        draft_accept_lens=acceptance.draft_accept_lens if acceptance else (),
        accepted=tuple(tree.tokens[n] for n in acceptance.path) if acceptance else (),
        emitted=tuple(kept),
        draft_s=timings.draft_s,
        verify_s=timings.verify_s,
        other_s=timings.other_s,
        new_tokens_total=len(state.output),
        elapsed_s=timings.elapsed_s,
        peak_mem_mb=peak_memory_mb(models.cuda_devices),
        cache_len=kv.cache_length(state.cache),
        draft_context_len=models.drafter.context_length(state.draft_state),
        setting=setting.as_tuple() if setting else (0, 0, 0),
        refinement=drafts.refinement if drafts else None,
    )


def result(models: Models, state: DecodeState, cfg: DecodeConfig, prefill_s: float, reason: str, total_s: float):
    text = models.tokenizer.decode(state.output, skip_special_tokens=True)
    if reason == "stop_string":
        text = text[: min(text.find(s) for s in cfg.stop if s in text)]
    return DecodeResult(
        text=text,
        token_ids=tuple(state.output),
        rounds=len(state.accept_lens),
        accept_lens=tuple(state.accept_lens),
        time_s=total_s,
        draft_s=state.draft_s,
        verify_s=state.verify_s,
        other_s=state.other_s,
        prefill_s=prefill_s,
        peak_mem_mb=peak_memory_mb(models.cuda_devices),
        stop_reason=reason,
        target_forwards=state.forwards,
        settings=tuple(state.settings),
        dtype=str(models.target.dtype).removeprefix("torch."),
    )


def calibrated(models: Models) -> Models:
    """The models with their stage costs measured (``calibrate``), for callers that run many ``auto`` requests."""
    return models if models.costs else replace(models, costs=calibrate(models))


CALIBRATION_TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun. "
CALIBRATION_CONTEXT = 128  # prompt tokens the calibration runs on: a typical chat's context
CALIBRATION_TOKENS = 32  # draft tokens in its widest verify forward
CALIBRATION_BLOCK = 8  # block length of its drafts


def calibrate(models: Models, repeats: int = 5) -> CostModel:
    """The controller's stage costs on these models (``CostModel``): target forwards over 1, 5 and 33 tokens, drafts of
    different forwards and positions (``calibration_drafts``, fitted by ``fit_draft_costs``), a plain round's acceptance
    and commit, and a drafting round's (its tree walked, committed, and auto's new search: ``CostModel.draft_other_s``),
    timed on a throwaway request (medians).

    Every draft is timed right after a commit, as in decoding: the drafter then first takes in the committed tokens
    (our drafter projects their features into its context), a cost that a draft on an unchanged context would miss.
    The stages are timed in turns (``timed_in_turns``): what the controller weighs is one stage against another, and
    on a shared machine whose speed drifts, stages timed one after the other can be off against each other by more
    than the choices they decide (measured: a plain step priced 1.3x its cost against the drafting rounds)."""
    clock = Clock(models.device)
    limit = context_limit(models.target) or 2 * CALIBRATION_CONTEXT
    wide = max(1, min(CALIBRATION_TOKENS, limit // 4))
    short = min(CALIBRATION_BLOCK // 2, wide)
    # The widest tree auto may verify: K x L nodes at its largest K and L.
    widest = min(max(AUTO_DRAFTS) * auto_longest_block(models.drafter.max_block), limit // 4)
    # A quarter of a short context each for the prompt and the widest tree: the turns' commits add a few dozen tokens.
    ids = models.tokenizer(CALIBRATION_TEXT * 64, return_tensors="pt")["input_ids"][
        :, : min(CALIBRATION_CONTEXT, limit // 4)
    ]
    with torch.no_grad():
        state, _ = prefill(models, ids.to(models.device), DecodeConfig())
        verifier = VERIFIERS["tree"]

        def verify(drafted: int) -> Callable[[], None]:
            def stage() -> None:
                past = kv.cache_length(state.cache)
                verifier.verify(models, state, build_tree(state.root, [[state.root] * drafted] if drafted else []))
                kv.truncate(state.cache, past)

            return stage

        def accept_and_commit() -> float:
            """A plain round on the throwaway request; returns the seconds of its acceptance and commit."""
            tree = build_tree(state.root, [[state.root]])
            verified = verifier.verify(models, state, tree)
            start = clock.now()
            commit(
                models,
                state,
                tree,
                verified,
                accept(tree, verified.node_logits, DecodeConfig(), state.noise),
                verifier,
            )
            return clock.now() - start

        # A drafting round past its forwards (``CostModel.draft_other_s``): the acceptance walk over a tree of 4 drafts,
        # the commit, and auto's bookkeeping and new search, which plain rounds skip. The planner's prices are
        # placeholders: its search does the same work whatever they are.
        planner, tree_round = control(models, DecodeConfig(auto=True), CostModel(0.0, 0.0, 1.0, 0.0, 0.0)), {}

        def draft_and_verify(setting: RoundSetting) -> None:
            drafts = draft(models, state, round_config(DecodeConfig(), setting), setting, False)
            tree = build_tree(state.root, cut_drafts(drafts.tokens, models, state))
            tree_round.update(setting=setting, drafts=drafts, tree=tree, verified=verifier.verify(models, state, tree))

        def rest_of_round() -> None:
            tree, verified, setting = tree_round["tree"], tree_round["verified"], tree_round["setting"]
            acceptance = accept(tree, verified.node_logits, DecodeConfig(), state.noise)
            commit(models, state, tree, verified, acceptance, verifier)
            planner.observe(
                setting, len(acceptance.path), accepted_with_fewer(tree_round["drafts"], tree, acceptance, setting)
            )
            planner.choose(remaining=4 * CALIBRATION_BLOCK)

        def drafting(setting: RoundSetting) -> Callable[[], object]:
            # K separate rows: the work the drafter declares (``draft_work``, ``refine_passes``); a tree drafts one
            # row a step (its refinement passes too), the same work at T = 1.
            cfg = round_config(DecodeConfig(diversity="branch-first"), setting)
            return lambda: draft(models, state, cfg, setting, False)

        stages = {"one": (verify(0), None), "few": (verify(short), None), "many": (verify(wide), None)}
        if widest > wide:
            stages["most"] = (verify(widest), None)
        drafts = (
            ()
            if isinstance(models.drafter, NoDrafter)
            else calibration_drafts(min(CALIBRATION_BLOCK, models.drafter.max_block or CALIBRATION_BLOCK))
        )
        stages |= {setting: (drafting(setting), accept_and_commit) for setting in drafts}
        if drafts:  # a tree of 4 drafts of the short block: auto's usual first round
            stages["rest"] = (rest_of_round, lambda: draft_and_verify(RoundSetting(4, 1, drafts[0].block)))
        seconds = timed_in_turns(clock, stages, repeats)
        other = statistics.median(accept_and_commit() for _ in range(repeats))
    verify_s = {0: seconds["one"], short: seconds["few"], wide: seconds["many"]} | (
        {widest: seconds["most"]} if "most" in seconds else {}
    )
    fitted = fitted_costs(models.drafter, verify_s, {s: seconds[s] for s in drafts}, other)
    return replace(fitted, draft_other_s=seconds.get("rest", 0.0))


def fitted_costs(drafter, verify_s: dict[int, float], draft_s: dict[RoundSetting, float], other_s: float) -> CostModel:
    """The ``CostModel`` of timed verify forwards (by tokens drafted), timed drafts and a round's acceptance and
    commit: the verify in pieces (``fit_verify_costs``), drafting per unit of the work the drafter declares
    (``fit_draft_costs``)."""
    forward_s, token_s, step_s, wide_from, wide_token_s = fit_verify_costs(verify_s)
    per_unit = fit_draft_costs(round_draft_work(drafter), draft_s) if draft_s else (0.0,) * 3
    return CostModel(
        *per_unit[:2],
        forward_s,
        token_s,
        other_s,
        step_s,
        verify_wide=wide_from,
        verify_wide_token_s=wide_token_s,
        draft_work=drafter.draft_work,
        pass_s=per_unit[2],
        refine_passes=drafter.refine_passes,
    )


def round_draft_work(drafter) -> Callable[[RoundSetting], tuple[int, int, int]]:
    """A round's drafting work at (K, T, L) as the drafter declares it: (forwards, positions, refinement passes)."""
    return lambda setting: (*drafter.draft_work(setting), drafter.refine_passes(setting))


def fit_verify_costs(seconds: dict[int, float]) -> tuple[float, float, float, int, float]:
    """(fixed, per token, step, wide, per token past wide) seconds of a verify forward from its seconds over a root
    alone and over a short and a wide chain of drafted tokens (keys: tokens drafted, 0 and two more), and maybe a
    widest one: the tokens' share from the two chains, the step from one token up to a forward over drafts from the
    short one (``CostModel.verify_draft_s``), the share past the wide chain from the widest (0, 0 without it:
    ``CostModel.verify_wide``). A root alone costs fixed + one token's share, so a plain step is priced exactly as
    timed, and every chain timed is priced as timed."""
    points = sorted(seconds.items())
    (_, one), (short, few), (wide, many) = points[:3]
    token_s = max(0.0, (many - few) / (wide - short)) if wide > short else max(0.0, (few - one) / short)
    fitted = (max(0.0, one - token_s), token_s, max(0.0, few - one - token_s * short))
    if len(points) < 4:
        return (*fitted, 0, 0.0)
    widest, most = points[3]
    return (*fitted, wide, max(0.0, (most - many) / (widest - wide)))


def timed_in_turns(clock: Clock, stages: dict, repeats: int) -> dict:
    """Median seconds of each stage ``(run, setup or None)``: every turn runs each stage once, right after its setup,
    so that a drift of the machine's speed shifts every stage alike; the first turn warms up and is not counted."""
    times: dict = {name: [] for name in stages}
    for turn in range(repeats + 1):
        for name, (run, setup) in stages.items():
            if setup:
                setup()
            start = clock.now()
            run()
            if turn:
                times[name].append(clock.now() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def calibration_drafts(block: int) -> tuple[RoundSetting, ...]:
    """Drafts whose declared (forwards, positions) tell the two draft costs apart for every drafter family: a short
    and a long block, two steps (a masked drafter's first step runs one row), four rows."""
    half, steps = max(1, block // 2), min(2, block)  # T <= L
    return (
        RoundSetting(1, 1, half),
        RoundSetting(1, 1, block),
        RoundSetting(1, steps, block),
        RoundSetting(4, steps, block),
    )


def fit_draft_costs(work: Callable[[RoundSetting], tuple[int, ...]], seconds: dict[RoundSetting, float]) -> tuple:
    """Seconds per unit of each kind of drafting work (per forward, per position, per refinement pass...): the
    least-squares fit of ``seconds`` to the drafts' declared work, no cost below zero (a column the drafts never do,
    or whose fit goes negative, costs zero and the others are fitted without it)."""
    rows = torch.tensor([work(s) for s in seconds], dtype=torch.float64)
    times = torch.tensor(list(seconds.values()), dtype=torch.float64)[:, None]
    kept = [c for c in range(rows.shape[1]) if rows[:, c].any()]
    while kept:
        fitted = torch.linalg.lstsq(rows[:, kept], times).solution[:, 0].tolist()
        if min(fitted) >= 0:
            break
        kept.pop(fitted.index(min(fitted)))  # the most negative: the work that explains the least
    costs = [0.0] * rows.shape[1]
    for column, cost in zip(kept, fitted if kept else []):
        costs[column] = cost
    return tuple(costs)
