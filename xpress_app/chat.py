"""One chat reply: the engine's events (and, with Race, plain decoding's beside them) turned into views for the page.

The engine decodes; this module only watches: it streams the reply's text often and the panels' figures seldom, so
that rendering takes a small share of the wall time, and it ends the reply between rounds when asked to stop.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from xpress_core import plots, verdict
from xpress_core.chat import cap_chars, fit_prompt
from xpress_core.engine import decode
from xpress_core.errors import XpressError
from xpress_core.models import context_limit
from xpress_core.race import race
from xpress_core.trace import DecodeResult, RoundTrace, write_jsonl

from .budget import Budget, Meter
from .log import LOG
from .models import Calibration, Loaded, ModelCache, TokenTexts, check_block, served
from .session import StopTicket, never
from .settings import UI_MAX_BLOCK, Settings, history_messages, user_message
from .texts import EMPTY_MESSAGE, VERDICT_PENDING, exactness
from .zerogpu import GPU_SETUP_S, GPU_TOKEN_S, on_gpu

# Rendering may take at most this share of the wall time, so that watching barely slows decoding; the engine's own
# timings exclude it anyway (its clock stops while we hold an event). The reply's text streams more often than the
# figures, which cost far more to build, send and draw.
UI_TIME_SHARE = 0.05
TEXT_INTERVAL_S = 0.25
PANELS_INTERVAL_S = 1.0
ANIMATION_FRAME_S = 0.2  # pause per denoise step when "animate" is on

SPECULATIVE, PLAIN = "speculative", "plain"
LOG_PREFIX = "xpress-rounds-"
LOG_TTL_S = 600  # a reply's round log can be downloaded for this long (Gradio's copy too), then it is deleted


@dataclass(frozen=True)
class Reply:
    """Everything the panels need about the last reply; kept in the session for scrubbing and the log."""

    traces: tuple[RoundTrace, ...]
    result: DecodeResult | None  # None while decoding (or after a stop)
    plain_result: DecodeResult | None
    token_text: TokenTexts

    @property
    def rounds(self) -> int:
        return max(0, len(self.traces) - 1)

    @property
    def max_steps(self) -> int:
        return max((len(t.steps) for t in self.traces), default=0) or 1


@dataclass(frozen=True)
class View:
    """One UI update. ``None`` leaves the component as it is."""

    message: str | None = None  # the input box
    history: list[dict] | None = None
    status: str | None = None
    plain: str | None = None
    evolution: object | None = None  # plotly figures
    accept: object | None = None
    latency: object | None = None
    provenance: object | None = None
    reply: Reply | None = None
    verdict: str | None = None  # why the reply was faster or slower than plain decoding
    notice: str | None = None  # shown as a toast
    done: bool = False  # the reply is complete: sliders and the log follow


class Board:
    """The reply being decoded: both runs' events so far, rendered into views."""

    def __init__(self, loaded: Loaded, history: list[dict], user_text: str, race: bool, notice: str | None):
        self.loaded, self.history, self.user_text, self.race, self.notice = loaded, history, user_text, race, notice
        self.traces: dict[str, list[RoundTrace]] = {SPECULATIVE: [], PLAIN: []}
        self.results: dict[str, DecodeResult] = {}
        self.started = time.perf_counter()
        self.wall_s: float | None = None  # request wall time including rendering, once finished
        self.stopped = False
        self.over: str | None = None  # why the request's budget ended it, if it did
        self.plain_after_s: float | None = None  # plain steps timed after the reply (``time_plain_steps``)

    def add(self, run: str, event: RoundTrace | DecodeResult) -> None:
        if isinstance(event, DecodeResult):
            self.results[run] = event
            if run == SPECULATIVE:
                self.wall_s = time.perf_counter() - self.started
        else:
            self.traces[run].append(event)

    def text(self, run: str) -> str:
        if run in self.results:
            return self.results[run].text
        ids = [token for t in self.traces[run] for token in t.emitted]
        return self.loaded.speculative.tokenizer.decode(ids, skip_special_tokens=True)

    def reply(self) -> Reply:
        return Reply(
            tuple(self.traces[SPECULATIVE]),
            self.results.get(SPECULATIVE),
            self.results.get(PLAIN),
            self.loaded.token_text,
        )

    def chat(self) -> list[dict]:
        return self.history + [
            {"role": "user", "content": self.user_text},
            {"role": "assistant", "content": self.text(SPECULATIVE)},
        ]

    def text_view(self) -> View:
        """The reply's text and status only: cheap enough to stream often."""
        return View(
            history=self.chat(),
            status=self.status(),
            plain=self.text(PLAIN) if self.race else None,
            reply=self.reply(),
            verdict=self.why(),
        )

    def view(self, done: bool = False, **extra) -> View:
        traces, plain = self.traces[SPECULATIVE], self.traces[PLAIN]
        token_text = self.loaded.token_text
        return replace(
            self.text_view(),
            evolution=plots.draft_evolution_figure(traces[-1], token_text) if traces else None,
            accept=plots.accept_length_figure(traces),
            latency=plots.latency_figure(traces, plain, self.plain_step()[0]),
            provenance=plots.provenance_figure(traces, token_text),
            done=done,
            **extra,
        )

    def plain_step(self) -> tuple[float | None, str]:
        """One plain decoding step's time, and where it comes from: measured beside the reply when possible (the
        Race's plain run, else the plain steps Auto chose in the reply itself: the same prompt, at the same time),
        else the timing taken when the models loaded."""
        measured = [(PLAIN, "measured by the Race")] if self.race else []
        for run, source in [*measured, (SPECULATIVE, "this reply's own plain steps")]:
            step_s = verdict.plain_step_s(self.traces[run])
            if step_s:
                return step_s, source
        if self.plain_after_s:
            return self.plain_after_s, f"{verdict.AFTER_REPLY_TOKENS} plain steps timed right after the reply"
        return self.loaded.plain_step_s, "timed when the models loaded"

    def time_plain_steps(self, prompt_ids) -> None:
        """A finished reply that measured no plain step beside its rounds gets some, timed now on its prompt."""
        if self.plain_step()[1] == "timed when the models loaded":
            self.plain_after_s = verdict.time_plain_steps(self.loaded.plain, prompt_ids)

    def reply_cost(self) -> verdict.ReplyCost | None:
        """The reply against the fastest plain decoding on this machine (``verdict.fastest_plain``)."""
        step_s, _ = self.plain_step()
        if not step_s:
            return None
        return verdict.reply_cost(self.traces[SPECULATIVE], verdict.fastest_plain(self.dtype_choice(), step_s)[0])

    def dtype_choice(self):
        return self.loaded.speculative.dtype_choice

    def plain_share(self) -> float:
        """The share of a plain step in the run dtype that the faster dtype's plain decoding takes (1: the same)."""
        return verdict.fastest_plain(self.dtype_choice(), 1.0)[0]

    def why(self) -> str:
        """The verdict: the whole reply against plain decoding of its tokens, and τ against what a round cost in
        plain steps, so far; with refinement passes, what they bought."""
        cost = self.reply_cost()
        if cost is None:
            return VERDICT_PENDING
        source = ", ".join(filter(None, (self.plain_step()[1], verdict.fastest_plain(self.dtype_choice(), 1.0)[1])))
        line = f"**{verdict.reply_headline(cost)}** · {verdict.breakdown(cost.rounds)} ({source})"
        gain = verdict.refinement_gain(self.traces[SPECULATIVE])
        return line if gain is None else f"{line} · {verdict.refinement_line(gain)}"

    def status(self) -> str:
        traces = self.traces[SPECULATIVE]
        lines = []
        if self.notice:
            lines.append(f"⚠ {self.notice}")
        result = self.results.get(SPECULATIVE)
        if result is not None:
            split = " · ".join(f"{name} {share:.0%}" for name, share in time_split(result).items())
            lines.append(
                f"✓ **{result.new_tokens} tokens in {result.rounds} rounds · "
                f"τ = {result.tau:.2f} tokens/round · {result.tokens_per_s:.1f} tokens/s** "
                f"(engine time, rendering excluded: prefill {1000 * result.prefill_s:.0f} ms · {split}) "
                f"· stop: {result.stop_reason}"
            )
            lines.append(f"Rounds: {verdict.settings_summary(traces)}.")
            gain = verdict.refinement_gain(traces)
            if gain is not None:  # only a reply whose rounds ran refinement passes
                lines.append(f"{verdict.refinement_line(gain)}.")
            lines.append(exactness(self.loaded.speculative.target.dtype, self.loaded.speculative.dtype_choice))
            if self.wall_s and not self.race:  # with Race the wall clock holds both runs
                lines.append(f"Wall clock with the UI: {result.new_tokens / self.wall_s:.1f} tokens/s.")
        elif traces:
            last = traces[-1]
            tau = plots.running_tau(traces[1:])[-1] if len(traces) > 1 else 0.0
            progress = f"{last.new_tokens_total} tokens · τ = {tau:.2f} · {last.tokens_per_s:.1f} tokens/s"
            ended = f"■ Stopped after {progress}" + (f": {self.over}" if self.over else "")
            lines.append(ended if self.stopped else f"… round {last.index} · {progress}")
        if self.race:
            lines.append(self.race_line())
        return "\n\n".join(lines)

    def race_line(self) -> str:
        spec, plain = self.traces[SPECULATIVE], self.traces[PLAIN]
        if not plain:
            return "Race · plain decoding: starting"
        plain_speed = plain[-1].tokens_per_s
        spec_speed = spec[-1].tokens_per_s if spec else 0.0
        line = f"Race (measured, prefill included) · plain decoding: {plain_speed:.1f} tokens/s"
        if plain_speed > 0 and spec_speed > 0:
            share = self.plain_share()  # against the faster dtype's plain decoding (verdict.fastest_plain)
            line += f" → speculative is ×{spec_speed * share / plain_speed:.2f}"
            line += (
                f" (over plain decoding in the faster dtype: ×{share:.2f} of this run's plain time)"
                if share < 1
                else ""
            )
        if len(self.results) == 2:
            same = self.results[SPECULATIVE].token_ids == self.results[PLAIN].token_ids
            line += " · same tokens ✓" if same else " · the outputs differ ✗"
            cost = self.reply_cost()
            if cost is not None:
                line += (
                    " · "
                    + verdict.agreement(cost, self.results[SPECULATIVE], self.results[PLAIN], self.plain_share())[1]
                )
        return line


def race_order(runs: dict[str, Iterator], past: list[dict]) -> dict[str, Iterator]:
    """The Race's runs in the order they start: the speculative run first on a chat's odd turns, the plain run on its
    even turns, so that neither is always the one that meets the machine (and any shape it has not seen) first."""
    turn = sum(m["role"] == "user" for m in past)
    return runs if turn % 2 == 0 else {PLAIN: runs[PLAIN], SPECULATIVE: runs[SPECULATIVE]}


def time_split(result: DecodeResult) -> dict[str, float]:
    parts = {"draft": result.draft_s, "verify": result.verify_s, "other": result.other_s}
    total = sum(parts.values()) or 1.0
    return {name: seconds / total for name, seconds in parts.items()}


class Throttle:
    """Lets an update through at most every ``interval_s``, and only when rendering has taken at most
    ``UI_TIME_SHARE`` of the wall time lately."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.last_end = float("-inf")
        self.last_cost = 0.0

    def due(self) -> bool:
        wait = max(self.interval_s, self.last_cost * (1 - UI_TIME_SHARE) / UI_TIME_SHARE)
        return time.perf_counter() - self.last_end >= wait

    @contextmanager
    def rendering(self):
        """Wraps building a view and the yield that hands it to Gradio (which serialises and sends it)."""
        start = time.perf_counter()
        yield
        self.last_end = time.perf_counter()
        self.last_cost = self.last_end - start


def run_chat(
    cache: ModelCache,
    message: str | None,
    history: list[dict] | None,
    settings: Settings,
    stop_requested: Callable[[], bool] = never,
    budget: Budget | None = None,
) -> Iterator[View]:
    """Answer one chat message: stream views while the engine decodes (and, with Race, plain decoding beside it).

    ``stop_requested`` is polled between rounds and animation frames, and so is the request's ``budget`` (default:
    ``Budget()``); when either says stop, the reply ends there, with a last view of what was decoded so far.
    """
    text = user_message(message)
    if not text:
        yield View(message="", status=EMPTY_MESSAGE, notice=EMPTY_MESSAGE)
        return
    cfg = settings.decode_config()
    chat = cap_chars([*history_messages(history), {"role": "user", "content": text}])
    if stop_requested():  # stopped or cleared while waiting in the queue
        return
    if not cache.is_loaded(settings.preset):
        yield View(message="", status=f"Loading “{settings.preset}”…")
    loaded = cache.get(settings.preset)
    meter = Meter(budget or Budget())  # from here: loading is shared, not this request's
    check_block(cfg.block, loaded, settings.preset)
    prompt = fit_prompt(
        loaded.speculative.tokenizer,
        chat.prompt,
        True,
        context_limit(loaded.speculative.target),
        cfg.max_new_tokens,
        chat.cuts,
    )
    past = list(chat.prompt[:-1])
    text = chat.prompt[-1]["content"]
    runs = {SPECULATIVE: decode(loaded.speculative, prompt.ids, cfg, watch=True)}
    if settings.race:
        runs = race_order(runs | {PLAIN: decode(loaded.plain, prompt.ids, cfg)}, past)
    board = Board(loaded, past, text, settings.race, prompt.notice)

    def halted() -> bool:
        board.over = meter.over()
        if board.over:
            LOG.info("ended /chat early: %s", board.over)
        return stop_requested() or board.over is not None

    panels, text_only = Throttle(PANELS_INTERVAL_S), Throttle(TEXT_INTERVAL_S)
    with panels.rendering():
        yield board.view(message="", notice=prompt.notice)
    with closing(race(runs)) as events:
        for run, event in events:
            board.add(run, event)
            if halted():
                board.stopped = True
                break
            if isinstance(event, DecodeResult):
                continue
            if settings.animate and run == SPECULATIVE and event.steps:
                yield from animation(board, event, halted)
            if panels.due():
                with panels.rendering():
                    yield board.view()
            elif text_only.due():
                with text_only.rendering():
                    yield board.text_view()
    if not board.stopped:
        board.time_plain_steps(prompt.ids)
    yield board.view(done=True)


def animation(board: Board, trace: RoundTrace, stop_requested: Callable[[], bool]) -> Iterator[View]:
    """One frame per denoise step of the round in the draft panel; the last frame also brings the round's text."""
    for step in range(len(trace.steps)):
        if stop_requested():
            return
        frame = View(evolution=plots.draft_evolution_figure(trace, board.loaded.token_text, step))
        if step == len(trace.steps) - 1:
            frame = replace(
                frame, history=board.chat(), status=board.status(), reply=board.reply(), verdict=board.why()
            )
        yield frame
        time.sleep(ANIMATION_FRAME_S)


def log_file(reply: Reply, directory: Path) -> str:
    """The reply's per-round JSONL log, in a file of its own (downloads may overlap). Logs older than ``LOG_TTL_S``
    go first: a public server must not fill its disk with one file per reply."""
    delete_old_logs(directory, LOG_TTL_S)
    handle, path = tempfile.mkstemp(prefix=LOG_PREFIX, suffix=".jsonl", dir=directory)
    with os.fdopen(handle, "w") as out:
        write_jsonl(list(reply.traces), out)
    return path


def delete_old_logs(directory: Path, age_s: float) -> None:
    cutoff = time.time() - age_s
    for path in directory.glob(f"{LOG_PREFIX}*"):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
        except FileNotFoundError:  # a concurrent request deleted it first
            pass


def scrub_figure(reply: Reply | None, round_index, step):
    """The draft panel for any round (0 = the prefill) and denoise step (from 1) of the last reply."""
    if reply is None or not reply.traces:
        return plots.message_figure(plots.EVOLUTION_TITLE, "Send a message first.")
    trace = reply.traces[min(max(int(round_index), 0), len(reply.traces) - 1)]
    return plots.draft_evolution_figure(trace, reply.token_text, int(step) - 1)


# --- a reply as a GPU call ----------------------------------------------------------------------------------------


def reply_views(
    cache: ModelCache, message, history, settings: Settings, budget: Budget, ticket: StopTicket
) -> Iterator[View | XpressError | Calibration]:
    """A reply as the web process serves it: an empty message, or a reply stopped while it waited, is answered here;
    else the settings are checked and the preset's models loaded (downloads included; no forward runs), so that a
    ZeroGPU worker forked from now on inherits them, and the reply decodes in ``chat_turn``, on a GPU there."""
    if not user_message(message) or ticket.requested():
        yield from run_chat(cache, message, history, settings, ticket.requested, budget)  # nothing to decode
        return
    settings.decode_config()
    if not cache.is_loaded(settings.preset):
        yield View(message="", status=f"Loading “{settings.preset}”…")
    cache.load(settings.preset)
    yield from chat_turn(message, history, settings, budget, ticket)


def reply_on_gpu(
    message, history, settings: Settings, budget: Budget, ticket: StopTicket
) -> Iterator[View | XpressError | Calibration]:
    """One reply as a GPU function runs it: plain data in (ZeroGPU pickles it to its worker), the models this process
    serves (``models.served``), views out (each pickled back). A refusal is yielded, not raised: ZeroGPU would pass on
    only the name of an exception's class. Last, if this call calibrated the models, what it measured
    (``ModelCache.adopt``: the web process keeps it, and workers forked later need not measure again)."""
    cache = served()
    fresh = not cache.is_ready(settings.preset)
    try:
        yield from run_chat(cache, message, history, settings, ticket.requested, budget)
    except XpressError as error:
        yield error
        return
    if fresh and (measured := cache.calibration(settings.preset)) is not None:
        yield measured


def reply_seconds(message, history, settings: Settings, budget: Budget, ticket: StopTicket) -> float:
    """The GPU time to ask for a reply (its settings checked already): its tokens, twice with the Race, and the
    animation's pauses, within the request's budget."""
    tokens = settings.max_new_tokens * (2 if settings.race else 1)
    frames = settings.max_new_tokens * (UI_MAX_BLOCK if settings.auto else settings.steps) if settings.animate else 0
    return GPU_SETUP_S + min(tokens * GPU_TOKEN_S + frames * ANIMATION_FRAME_S, budget.wall_s)


# ZeroGPU attaches a GPU for each reply; elsewhere this is reply_on_gpu itself.
chat_turn = on_gpu(reply_on_gpu, duration=reply_seconds)
