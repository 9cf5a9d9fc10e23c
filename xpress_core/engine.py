"""The decoding loop: prefill -> (draft -> tree -> verify -> accept -> commit)*, yielding one event per round.

State between rounds (docs/DESIGN.md §2): the committed tokens are the prompt plus ``output``; the target cache holds
all of them but the last one, the *root*, which enters the cache with the next verify forward. The drafter's context
holds exactly what the target cache holds. Before each round the settings' control (``controller.py``) says what to
draft: a fixed (K, T, L), or ``auto``'s choice.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import torch

from . import cache as kv
from . import machine
from .config import TREE, DecodeConfig
from .controller import (
    CHOSEN_STEPS,
    MODES,
    PLAIN_STEP,
    SPECULATE_MARGIN,
    ChosenControl,
    CostModel,
    FixedControl,
    RecordedRound,
    RoundSetting,
    SettingChoice,
    auto_longest_block,
    candidate_settings,
    choose_setting,
    confirmed,
    path_chances,
    setting_name,
    speed_ratio,
)
from .costs import calibration_drafts, fitted_costs, timed_in_turns
from .counting import AUTO_DRAFTS, AutoControl
from .drafters.base import DraftRandomness, Drafts, NoDrafter
from .errors import XpressError
from .models import Models, context_limit, encode_prompt, eos_ids
from .sampling import TargetNoise, draw_token
from .trace import DecodeResult, RoundTrace, StageClock, peak_memory_mb
from .tree import Acceptance, DraftTree, accept, build_tree
from .verify import VERIFIERS, Verified, target_forward

# The grad mode a request's work runs in: inference mode, whose tensors track no versions or views (a fixed cost of
# every op; the ops of a small model's forward are mostly fixed cost on a CPU). Their tensors stay in the request:
# the events carry Python values.
WORK_MODE = torch.inference_mode


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
    context: int | None  # the target's context (``context_limit``), looked up once: a config read costs a round
    window: int | None  # the target's sliding window (``cache.sliding_window``) for a tree's mask, looked up once too
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


class Clock(StageClock):
    """Wall clock that waits for queued CUDA work first, so timings are real, and that stops while the consumer
    holds a yielded event. What ``calibrate`` times its stages with; a round marks its stages on a ``StageClock``,
    which waits once a round."""

    def __init__(self, device: torch.device, devices=None):
        super().__init__(device, events=False)  # its pausing and ``now``; every reading waits for the GPUs instead
        self.cuda, self.devices = device.type == "cuda", devices

    def host_time(self) -> float:
        if self.cuda:
            wait_for_gpus(self.devices)
        return time.perf_counter()


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
    context, window = context_limit(models.target), kv.sliding_window(models.target.config)
    state = DecodeState(cache, draft_state, first, [], noise, drafter_rng, prompt_ids.shape[1], context, window)
    return state, first


def control(models: Models, cfg: DecodeConfig, costs: CostModel | None) -> FixedControl | AutoControl:
    """The rounds' settings: pinned; or auto: the setting chosen at load where the drafter's trees carry chances
    (``ChosenControl``; where that is plain steps, drafting where a request's rounds pay), else ``AutoControl``."""
    if not cfg.auto:
        return FixedControl(cfg)
    costs = costs or models.costs or calibrate(models)
    if cfg.diversity == TREE and models.drafter.offers_chances:
        if costs.chosen is None:  # one chain of the longest block
            return ChosenControl(RoundSetting(1, 1, auto_longest_block(models.drafter.max_block)), costs)
        return ChosenControl.of(costs.chosen, not cfg.greedy, costs)
    can_draft = not isinstance(models.drafter, NoDrafter)
    return AutoControl(
        costs,
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
    room = state.context
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
    limit = state.context
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
    models: Models,
    prompt_ids: torch.Tensor,
    cfg: DecodeConfig,
    watch: bool = False,
    costs: CostModel | None = None,
    settings=None,
) -> Iterator[RoundTrace | DecodeResult]:
    """Yield one ``RoundTrace`` per round (round 0 is the prefill), then one ``DecodeResult``.

    ``watch``: the events carry the drafter's denoise steps (for the visualizer); without it drafting builds no
    per-step lists and the events carry none. ``costs``: the stage costs ``auto`` plans with (default: the models',
    or measured now: a caller that serves many requests keeps ``calibrated(models)``). ``settings``: the rounds'
    control (default ``control(models, cfg, costs)``; ``recorded_rounds`` passes one that records the rounds).
    """
    cfg.validate()
    if not cfg.auto:
        models.drafter.check_block(cfg)
    check_prompt(models, prompt_ids)
    clock, eos = StageClock(models.device, devices=models.cuda_devices), stop_token_ids(models)
    verifier = VERIFIERS[cfg.verify]
    settings = settings or control(models, cfg, costs)
    for device in models.cuda_devices:
        torch.cuda.reset_peak_memory_stats(device)
    # Autograd is off for each stretch of work, not across the yields: the consumer keeps its own mode between events,
    # and whichever thread resumes the generator (the app resumes it on Gradio's worker threads) runs without it.
    # Inference mode, not only no grad: the request's tensors (caches, drafter state) then keep no version counters or
    # view records, a fixed cost of every small op (``WORK_MODE``).
    with WORK_MODE():
        start, begun = clock.now(), clock.mark()
        state, first = prefill(models, prompt_ids, cfg)
        kept, reason = finish(models, state, [first], cfg, eos)
        (prefill_s,) = clock.seconds(begun, clock.mark())
    with clock.paused():
        yield record(models, state, kept, Timings(0.0, prefill_s, 0.0, clock.now() - start))
    while reason is None:  # a round waits for the device three times: the drafts, the target's draws, the clock
        with WORK_MODE():
            t0 = clock.mark()
            setting = settings.choose(output_limit(models, state, cfg) - len(state.output))
            drafts = settings.to_verify(draft(models, state, cfg, setting, watch))
            t1 = clock.mark()
            tree = build_tree(state.root, cut_drafts(drafts.tokens, models, state))
            verified = verifier.verify(models, state, tree)
            t2 = clock.mark()
            acceptance = accept(tree, verified.node_logits, cfg, state.noise, verified.depths)
            commit(models, state, tree, verified, acceptance, verifier)
            fewer = accepted_with_fewer(drafts, tree, acceptance, setting) if settings.counts_fewer else ()
            settings.observe(setting, len(acceptance.path), fewer)
            emitted = [tree.tokens[n] for n in acceptance.path] + [acceptance.bonus]
            kept, reason = finish(models, state, emitted, cfg, eos)
            timings = Timings(*clock.seconds(t0, t1, t2, clock.mark()), clock.now() - start)
            settings.timed(timings)  # auto corrects its prices by what the round took
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
    """The controller's stage costs on these models (``CostModel``): target forwards over 1, 5 and 33 tokens (and the
    widest tree auto may verify), drafts of different forwards and positions (``calibration_drafts``, fitted by
    ``fit_draft_costs``), a plain round's acceptance and commit, and a drafting round's (its tree walked, committed, and
    auto's bookkeeping: ``CostModel.draft_other_s``), timed on a throwaway request (medians); and auto's fixed
    settings chosen at these costs (``chosen_setting``).

    Every draft is timed right after a commit, as in decoding: the drafter then first takes in the committed tokens
    (our drafter projects their features into its context), a cost that a draft on an unchanged context would miss.
    The stages are timed in turns (``timed_in_turns``): what the controller weighs is one stage against another, and
    on a shared machine whose speed drifts, stages timed one after the other can be off against each other by more
    than the choices they decide (measured: a plain step priced 1.3x its cost against the drafting rounds)."""
    with WORK_MODE():  # as decoding runs them
        run = CalibrationRun(models)
        stages = run.verify_stages() | run.draft_stages() | run.round_stages()
        seconds = timed_in_turns(run.clock, stages, repeats)
        other = statistics.median(run.accept_and_commit() for _ in range(repeats))
    verify_s = {tokens: seconds[("verify", tokens)] for tokens in run.verify_widths}
    drafted = {s: seconds[s] for s in run.drafts}
    fitted = fitted_costs(models.drafter, verify_s, drafted, other)
    fitted = replace(fitted, draft_other_s=seconds.get("rest", 0.0))
    return replace(fitted, chosen=chosen_setting(models, fitted))


SETTING_CACHE = "setting_choice.json"  # auto's settings chosen before, per machine, threads and models
# The requests ``recorded_rounds`` decodes: none of the benchmark's prompts, a chat's kinds of request.
CHOICE_PROMPTS = (
    "Hi! Can you help me find a good place to eat dinner tonight?",
    "I would like to book two tickets for a movie this weekend.",
    "Write a short story about a little cat who finds a red ball.",
    "What is a good way to spend a rainy afternoon at home?",
    "Tell me about a book you like and why you like it.",
    "Once upon a time, a small boat sailed out to sea. Go on with the story.",
)
CHOICE_TOKENS = 64  # new tokens a request: about 25 rounds per candidate a request
CHOICE_TEMPERATURE = 0.7  # the sampled setting is chosen at the app's and the benchmark's usual temperature


def chosen_setting(models: Models, costs: CostModel) -> SettingChoice | None:
    """auto's fixed settings (greedy and sampled) for a drafter whose trees carry their chances: the candidate with the
    most tokens per calibrated second, each round verifying what its chances pay for (``choose_setting`` replays the
    ``recorded_rounds`` of the widest candidate, whose first k x L nodes are the tree of k drafts), chosen
    once per machine, threads and models and kept in the cache folder with the figures that chose it, as the dtype
    is (``precision.py``). None for other drafters (the counting model plans per round)."""
    drafter = models.drafter
    if not drafter.offers_chances:
        return None
    candidates = candidate_settings(drafter.max_block, CHOSEN_STEPS)
    threads, path = torch.get_num_threads(), machine.cache_file(SETTING_CACHE)
    key = machine.machine_key(
        threads,
        candidates=[c.as_tuple() for c in candidates],
        # The rule that chose: a cached choice made without the margin, or without it against plain steps, is
        # measured again.
        margin={"over": "plain steps and narrower trees", "factor": SPECULATE_MARGIN},
        verify="nodes worth verifying, chances by their share",  # ... or without the cut (``nodes_worth_verifying``)
        confirmed="decoded against plain steps",  # ... or drafting on the replay's word alone (``confirmed``)
        target=machine.loaded_identity(models.target),
        drafter=machine.loaded_identity(getattr(drafter, "model", None)) | {"kind": type(drafter).__name__},
    )
    try:
        return SettingChoice.from_json(
            machine.cached_entry(path, key), f"cached in {path} (delete it to measure again)"
        )
    except (KeyError, TypeError):
        pass
    start = time.perf_counter()
    widest = max(candidates, key=lambda s: s.nodes)
    rounds = {mode: recorded_rounds(models, mode == "sampled", widest) for mode in MODES}
    figures = {mode: choose_setting(rounds[mode], candidates, costs) for mode in MODES}
    settings = {}
    for mode, (setting, figured) in figures.items():
        if not setting.plain:  # drafting only where it also decodes faster than plain steps
            chosen = figured[setting_name(setting)]
            drafting, plain = decoded_in_turns(models, mode == "sampled", setting, costs, chosen["share"])
            if (ratio := speed_ratio(drafting, plain)) is not None:  # None: a request set that decoded nothing
                chosen["decoded_over_plain"] = ratio
            setting = confirmed(setting, drafting, plain)
        settings[mode] = setting
    where = f"{threads} thread" + ("" if threads == 1 else "s")
    reason = f"measured at load, {where}, in {time.perf_counter() - start:.1f} s"
    choice = SettingChoice(settings["greedy"], settings["sampled"], {m: f[1] for m, f in figures.items()}, reason)
    machine.store_entry(path, key, choice.to_json())
    return choice


def choice_requests(models: Models, sampled: bool) -> tuple[DecodeConfig, list[torch.Tensor]]:
    """The choice's requests: ``CHOICE_PROMPTS`` (chats where there is a template), greedy or sampled, as configured."""
    cfg = DecodeConfig(temperature=CHOICE_TEMPERATURE if sampled else 0.0, max_new_tokens=CHOICE_TOKENS)
    chat = bool(getattr(models.tokenizer, "chat_template", None))
    return cfg, [encode_prompt(models.tokenizer, text, chat) for text in CHOICE_PROMPTS]


def decoded_in_turns(models: Models, sampled: bool, setting: RoundSetting, costs: CostModel, share: float) -> list:
    """[(tokens, seconds) at ``setting`` as ``auto`` drafts it, the same with plain steps]: the ``choice_requests``
    both ways in turns (the machine's drift hits both alike), in the rounds' own seconds (no prefill, no events)."""
    (cfg, prompts), totals = choice_requests(models, sampled), [(0, 0.0), (0, 0.0)]
    for prompt, way in itertools.product(prompts, (0, 1)):
        control = ChosenControl(setting, costs, share) if way == 0 else ChosenControl(PLAIN_STEP)
        for event in decode(models, prompt, cfg, settings=control):
            if isinstance(event, RoundTrace) and event.index:
                tokens, seconds = totals[way]
                totals[way] = (tokens + len(event.emitted), seconds + event.draft_s + event.verify_s + event.other_s)
    return totals


class RoundRecorder(FixedControl):
    """A fixed setting whose drafts are kept, to be read with the rounds' events (``recorded_rounds``)."""

    def __init__(self, cfg: DecodeConfig):
        super().__init__(cfg)
        self.drafts: Drafts | None = None

    def to_verify(self, drafts: Drafts) -> Drafts:
        self.drafts = drafts
        return drafts


def recorded_rounds(models: Models, sampled: bool, widest: RoundSetting) -> list[RecordedRound]:
    """The drafting rounds of the ``choice_requests`` decoded at the widest candidate: per round its tree's path
    chances best first and the places in that order of the nodes it accepted (the path whose tokens begin with the
    accepted ones: a tree's shared nodes sit in every path through them), for ``choose_setting`` to replay."""
    cfg, prompts = choice_requests(models, sampled)
    rounds = []
    cfg = round_config(cfg, widest)
    for prompt in prompts:
        recorder = RoundRecorder(cfg)
        for event in decode(models, prompt, cfg, settings=recorder):
            drafts = recorder.drafts
            if not isinstance(event, RoundTrace) or event.index == 0 or drafts is None or not drafts.order:
                continue
            a = event.accept_len
            orders = next(o[:a] for t, o in zip(drafts.tokens, drafts.order) if tuple(t[:a]) == event.accepted)
            rounds.append(RecordedRound(tuple(path_chances(drafts.order, drafts.chances)), tuple(orders)))
    return rounds


class CalibrationRun:
    """A throwaway request and the stages ``calibrate`` times on it, each a ``(run, setup or None)`` pair."""

    def __init__(self, models: Models):
        self.models, self.clock, self.verifier = models, Clock(models.device, models.cuda_devices), VERIFIERS["tree"]
        limit = context_limit(models.target) or 2 * CALIBRATION_CONTEXT
        wide = max(1, min(CALIBRATION_TOKENS, limit // 4))
        # The widest tree auto may verify: K x L nodes at its largest K and L.
        widest = min(max(AUTO_DRAFTS) * auto_longest_block(models.drafter.max_block), limit // 4)
        self.verify_widths = sorted(
            {0, min(CALIBRATION_BLOCK // 2, wide), wide} | ({widest} if widest > wide else set())
        )
        self.block = min(CALIBRATION_BLOCK, models.drafter.max_block or CALIBRATION_BLOCK)
        none = isinstance(models.drafter, NoDrafter)
        self.drafts = () if none else calibration_drafts(self.block)
        # A quarter of a short context each for the prompt and the widest tree: the turns' commits add a few dozen
        # tokens.
        ids = models.tokenizer(CALIBRATION_TEXT * 64, return_tensors="pt")["input_ids"]
        self.state, _ = prefill(
            models, ids[:, : min(CALIBRATION_CONTEXT, limit // 4)].to(models.device), DecodeConfig()
        )
        # auto's bookkeeping and search, timed in the round's rest. The planner's prices are placeholders: its search
        # does the same work whatever they are.
        self.planner = control(models, DecodeConfig(auto=True), CostModel(0.0, 0.0, 1.0, 0.0, 0.0))
        self.round: dict = {}

    def verify(self, drafted: int) -> Callable[[], None]:
        """A verify forward over a chain of ``drafted`` tokens after the root, taken back out of the cache."""

        def stage() -> None:
            state, past = self.state, kv.cache_length(self.state.cache)
            self.verifier.verify(
                self.models, state, build_tree(state.root, [[state.root] * drafted] if drafted else [])
            )
            kv.truncate(state.cache, past)

        return stage

    def accept_and_commit(self) -> float:
        """A plain round on the throwaway request; returns the seconds of its acceptance and commit."""
        state, tree = self.state, build_tree(self.state.root, [[self.state.root]])
        verified = self.verifier.verify(self.models, state, tree)
        start = self.clock.now()
        acceptance = accept(tree, verified.node_logits, DecodeConfig(), state.noise)
        commit(self.models, state, tree, verified, acceptance, self.verifier)
        return self.clock.now() - start

    def verify_stages(self) -> dict:
        return {("verify", tokens): (self.verify(tokens), None) for tokens in self.verify_widths}

    def draft_stages(self) -> dict:
        """The drafts whose fit prices every setting (K separate rows: the work the drafter declares, ``draft_work``,
        ``refine_passes``; a tree drafts one row a step, the same work at T = 1)."""
        stages = {}
        for setting in self.drafts:
            cfg = round_config(DecodeConfig(diversity="branch-first"), setting)
            stages[setting] = (
                lambda cfg=cfg, setting=setting: draft(self.models, self.state, cfg, setting, False),
                self.accept_and_commit,
            )
        return stages

    def round_stages(self) -> dict:
        """A drafting round past its forwards (``CostModel.draft_other_s``): the acceptance walk over its tree, the
        commit, and auto's bookkeeping and new search, which plain rounds skip; after a tree of 4 drafts of the short
        block (auto's usual first round)."""
        return {"rest": (self.rest_of_round, self.draft_and_verify)} if self.drafts else {}

    def draft_and_verify(self) -> None:
        models, state = self.models, self.state
        setting = RoundSetting(4, 1, self.drafts[0].block)
        drafts = draft(models, state, round_config(DecodeConfig(), setting), setting, False)
        tree = build_tree(state.root, cut_drafts(drafts.tokens, models, state))
        self.round.update(setting=setting, drafts=drafts, tree=tree, verified=self.verifier.verify(models, state, tree))

    def rest_of_round(self) -> None:
        tree, verified, setting = self.round["tree"], self.round["verified"], self.round["setting"]
        acceptance = accept(tree, verified.node_logits, DecodeConfig(), self.state.noise)
        commit(self.models, self.state, tree, verified, acceptance, self.verifier)
        counted = self.planner.counts_fewer  # as decoding does: only a controller that counts them pays for them
        fewer = accepted_with_fewer(self.round["drafts"], tree, acceptance, setting) if counted else ()
        self.planner.observe(setting, len(acceptance.path), fewer)
        self.planner.choose(remaining=4 * CALIBRATION_BLOCK)
