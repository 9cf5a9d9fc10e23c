"""The Sweep tab's measurement: a small (K, T) grid measured live on a preset's models by the benchmark's own
``bench.measure.sweep`` (transformers generate as the plain-decoding baseline, every output checked against it), drawn
with the benchmark's heatmap builders."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from xpress_core import validation
from xpress_core.bench import measure
from xpress_core.bench.figures import heatmap
from xpress_core.bench.measure import BenchRun, MachineLoad, Progress
from xpress_core.bench.methods import REFERENCE, XPRESS
from xpress_core.bench.summary import Summary, paired_speedups
from xpress_core.chat import cap_chars, fit_prompt
from xpress_core.config import DecodeConfig
from xpress_core.data import Prompt, evaluation_prompts, spread
from xpress_core.drafters.base import NoDrafter
from xpress_core.errors import XpressError
from xpress_core.models import context_limit
from xpress_core.verdict import fastest_plain

from .budget import Budget, Meter
from .log import LOG
from .models import Calibration, Loaded, ModelCache, check_block, served
from .session import StopTicket, never
from .settings import UI_MAX_BLOCK, UI_MAX_DRAFTS, check_whole_numbers, user_message
from .zerogpu import GPU_SETUP_S, GPU_TOKEN_S, on_gpu

HELD_OUT, CHAT_BOX = "held-out prompts", "the chat box text"
CHAT_BOX_PROMPT = "chat-box"  # its name in the benchmark's records
SWEEP_SOURCES = (HELD_OUT, CHAT_BOX)
SWEEP_MAX_PROMPTS = 8
SWEEP_MAX_NEW_TOKENS = 256
# Grid settings x prompts x repeats at most: with the warm-up and the baseline, a sweep on the embedded models then
# stays within a few minutes on a 2-core CPU Space.
SWEEP_MAX_RUNS = 48
# Every setting runs on every prompt up to this many times (as many as fit in SWEEP_MAX_RUNS), the methods taking
# turns prompt by prompt: the speedups shown are medians with their spread, and a passing load moves a few runs, not
# the figure (issue 39).
SWEEP_REPEATS = 3


@dataclass(frozen=True)
class SweepRequest:
    """The Sweep tab's controls as the UI (or an API client) sends them; checked by ``grid`` and ``run_sweep``."""

    preset: str = ""
    drafts: tuple[int, ...] = (1, 4)  # K values
    steps: tuple[int, ...] = (1, 2)  # T values; those above L are left out
    block: int = 8  # L
    source: str = HELD_OUT
    prompts: int = 2  # held-out prompts to run (the chat box text is one prompt)
    max_new_tokens: int = 64

    def grid(self) -> tuple[DecodeConfig, ...]:
        """The (K, T) settings at block L, greedy, parallel refinement and tree verification."""
        whole = {
            "block L": (self.block, 1, UI_MAX_BLOCK),
            "prompts": (self.prompts, 1, SWEEP_MAX_PROMPTS),
            "max new tokens": (self.max_new_tokens, 1, SWEEP_MAX_NEW_TOKENS),
        }
        whole |= {f"drafts K={k}": (k, 1, UI_MAX_DRAFTS) for k in self.drafts or ()}
        whole |= {f"denoise steps T={t}": (t, 1, UI_MAX_BLOCK) for t in self.steps or ()}
        check_whole_numbers(whole)
        if not self.drafts or not self.steps:
            raise XpressError("Pick at least one value of drafts K and one of denoise steps T.")
        validation.choice("the prompts' source", self.source, SWEEP_SOURCES)
        steps = sorted({int(t) for t in self.steps if t <= self.block})
        if not steps:
            raise XpressError(f"Every denoise steps value T is above the block L={self.block}: pick T ≤ L.")
        grid = tuple(
            DecodeConfig(drafts=int(k), steps=t, block=int(self.block)) for k in sorted(set(self.drafts)) for t in steps
        )
        runs = len(grid) * self.prompt_count
        if runs > SWEEP_MAX_RUNS:
            raise XpressError(
                f"{len(grid)} settings × {self.prompt_count} prompts = {runs} runs is more than the {SWEEP_MAX_RUNS} a "
                f"sweep may take here: pick fewer values or prompts."
            )
        return tuple(c.validate() for c in grid)

    @property
    def prompt_count(self) -> int:
        return int(self.prompts) if self.source == HELD_OUT else 1

    def repeats(self, settings: int) -> int:
        """How often each of ``settings`` runs on each prompt: SWEEP_REPEATS, or as often as fits in SWEEP_MAX_RUNS."""
        return max(1, min(SWEEP_REPEATS, SWEEP_MAX_RUNS // (settings * self.prompt_count)))


@dataclass(frozen=True)
class SweepView:
    """The Sweep tab's update. ``None`` leaves a component as it is."""

    status: str
    tokens_per_s: object | None = None  # plotly figures
    tau: object | None = None
    table: str | None = None  # markdown
    run: BenchRun | None = None


class SweepCancelled(Exception):
    """Raised from the sweep's progress callback to end it between runs (its message: why, when the budget did). Not
    an XpressError: the benchmark reports those as settings it could not run and goes on."""


def values(name: str, chosen) -> tuple:
    """A multiple choice's values (checked one by one in ``SweepRequest.grid``): a list, or nothing chosen."""
    if chosen is None:
        return ()
    if not isinstance(chosen, (list, tuple)):
        raise XpressError(f"{name} must be a list of values, got {chosen!r:.60}")
    return tuple(chosen)


SWEEP_SETS = ("sgd_dev", "stories")  # shipped with the project (xpress_core/prompts/): a Space has them too


def sweep_prompts(request: SweepRequest, message: str | None) -> tuple[Prompt, ...]:
    """The prompts to sweep on: the held-out ones spread, or the chat box text. That text is held to the character
    caps here, before anything loads, and fitted to the tokens later, as every prompt is
    (``xpress_core.chat.fit_prompt``)."""
    if request.source == CHAT_BOX:
        text = user_message(message)
        if not text:
            raise XpressError(
                "The chat box is empty: type a prompt there (no need to send it), or use held-out prompts."
            )
        capped = cap_chars([{"role": "user", "content": text}])
        return (Prompt(CHAT_BOX_PROMPT, (("user", capped.prompt[-1]["content"]),), chat=True),)
    return spread(evaluation_prompts(SWEEP_SETS), request.prompts)


STOPPED_BEFORE_FIRST_RUN = "■ Sweep stopped before its first run: nothing measured to show."


def run_sweep(
    cache: ModelCache,
    request: SweepRequest,
    message: str | None,
    progress: Progress | None = None,
    stop_requested: Callable[[], bool] = never,
    budget: Budget | None = None,
) -> SweepView:
    """Run the Sweep tab's grid with ``bench.measure.sweep`` and build its heatmaps and table.

    ``progress`` gets (runs done, runs in all, setting); ``stop_requested`` and the request's ``budget`` (the whole
    grid's; default ``Budget()``) are checked after every run and end the sweep there.
    """
    grid = request.grid()
    prompts = sweep_prompts(request, message)
    loaded = cache.get(request.preset)
    meter = Meter(budget or Budget())  # from here: loading is shared, not this request's
    check_block(request.block, loaded, request.preset)
    if isinstance(loaded.speculative.drafter, NoDrafter):
        raise XpressError(f"“{request.preset}” has no drafter: there is nothing to sweep.")
    note = fitted_notice(loaded, message, int(request.max_new_tokens)) if request.source == CHAT_BOX else None
    reached = [0, 0]
    beside = [0]  # the most other requests the app served at once while this sweep measured

    def report(done: int, total: int, label: str) -> None:
        reached[:] = done, total
        beside[0] = max(beside[0], cache.in_flight.count() - 1)
        if progress:
            progress(done, total, label)
        if stop_requested():
            raise SweepCancelled
        over = meter.over()
        if over:
            LOG.info("ended /sweep early: %s", over)
            raise SweepCancelled(over)

    if stop_requested():  # Stop pressed as the GPU was attached: not one run
        return SweepView(STOPPED_BEFORE_FIRST_RUN)
    try:
        with cache.in_flight.serving():
            run = measure.sweep(
                loaded.speculative,
                prompts,
                grid,
                max_new_tokens=int(request.max_new_tokens),
                repeats=request.repeats(len(grid)),
                progress=report,
            )
    except SweepCancelled as cancelled:
        why = f": {cancelled}" if str(cancelled) else ""
        return SweepView(f"■ Sweep stopped after {reached[0]} of {reached[1]} runs{why}: nothing measured to show.")
    plain = fastest_plain(loaded.speculative.dtype_choice, 1.0)  # the faster dtype's plain step, per run-dtype step
    return SweepView(
        status=sweep_status(run, len(prompts), note, beside[0], loaded.speculative.target.dtype, plain),
        tokens_per_s=heatmap(run.summaries, "tokens_per_s"),
        tau=heatmap(run.summaries, "tau"),
        table=sweep_table(run, exact(loaded.speculative.target.dtype), plain[0]),
        run=run,
    )


def fitted_notice(loaded: Loaded, message: str, max_new_tokens: int) -> str | None:
    """What the caps and the target's context leave out of the chat box text (the sweep measures what is left)."""
    models = loaded.speculative
    limit = context_limit(models.target)
    chat = [{"role": "user", "content": user_message(message)}]
    notice = fit_prompt(models.tokenizer, chat, True, limit, max_new_tokens).notice
    return notice and notice.rstrip(".")


def exact(dtype: torch.dtype) -> bool:
    """Whether xPress must give plain decoding's tokens exactly: in float32 yes (a difference is a bug); in a 16-bit
    dtype a forward over many positions rounds differently from one over one position, so near-ties may tip."""
    return dtype == torch.float32


def sweep_status(
    run: BenchRun, prompts: int, note: str | None, beside: int, dtype: torch.dtype, plain=(1.0, "")
) -> str:
    """``plain``: ``verdict.fastest_plain`` of one run-dtype plain step: the speedups are over the faster dtype's plain
    decoding."""
    xpress = [s for s in run.summaries if s.setting.method == XPRESS]
    paired = paired_speedups(run.measurements)
    lines = [f"⚠ {note}."] if note else []
    if xpress:
        best = max(xpress, key=lambda s: paired[s.setting, s.temperature].median)
        speedup, share = paired[best.setting, best.temperature], plain[0]
        against = f" ({plain[1]})" if plain[1] else ""
        lines.append(
            f"✓ **settings: {len(xpress)} · prompts: {prompts} · repeats: {best.calls // prompts} · best "
            f"{best.setting.label}: "
            f"×{share * speedup.median:.2f} over plain decoding{against} (half the runs "
            f"×{share * speedup.low:.2f}–{share * speedup.high:.2f}), "
            f"{best.tokens_per_s:.1f} tokens/s, τ = {best.tau:.2f}**"
        )
    lines.append(load_line(run.load, beside))
    lines += [f"⚠ {name} not run: {why}" for name, why in run.skipped]
    if run.mismatches:
        lines.append(mismatch_lines(run, dtype))
    elif xpress:
        lines.append("Every output equals plain decoding's, token for token.")
    return "\n\n".join(lines)


def load_line(load: MachineLoad | None, beside: int) -> str:
    """Whether the machine was busy while the sweep measured: the OS's load and the app's other requests."""
    others = f"{beside} other request{'s' if beside != 1 else ''} in the app at once" if beside else ""
    if load is None:
        return f"⚠ Measured beside {others}." if others else "No other request ran in the app meanwhile."
    seen = f"load average {load.lowest:.1f}–{load.highest:.1f} on {load.cores} cores, this sweep's own {load.threads}"
    seen += f" thread{'s' if load.threads != 1 else ''}" + (f"; {others}" if others else "")
    if not (load.busy or beside):
        return f"Measured on a quiet machine ({seen})."
    return (
        f"⚠ **Measured on a busy machine** ({seen}): other work shared the cores. It slows plain decoding's many "
        "small forwards more than speculation's few larger ones, so these speedups hold under this load; on a quiet "
        "machine they are usually smaller."
    )


def mismatch_lines(run: BenchRun, dtype: torch.dtype) -> str:
    """The outputs that part from plain decoding's: a failure in float32; in a 16-bit dtype, rounding, explained."""
    parted = {(m.prompt, m.setting.label, m.first_difference): m for m in run.mismatches}  # the repeats agree
    where = "; ".join(
        f"{prompt} with {label}: new token {first + 1} is {visible(m.got_token)} where plain decoding has "
        f"{visible(m.expected_token)}"
        for (prompt, label, first), m in list(parted.items())[:4]
    ) + (f"; and {len(parted) - 4} more" if len(parted) > 4 else "")
    name = str(dtype).removeprefix("torch.")
    calls = sum(s.checked for s in run.summaries)
    if exact(dtype):
        return f"✗ **{len(run.mismatches)} of {calls} outputs differ from plain decoding's in {name}**: {where}."
    return (
        f"≈ {len(run.mismatches)} of {calls} outputs part from plain decoding's in {name}, by rounding: {where}. "
        f"In {name} the target's forward over a whole draft rounds differently from its forward over one token, so "
        "where two tokens are nearly tied the other one can win; in float32 xPress gives plain decoding's tokens "
        "exactly (its tests check it token for token)."
    )


def visible(token: str) -> str:
    return f"`{token!r}`" if token else "the end"


def sweep_table(run: BenchRun, exact_tokens: bool, share: float = 1.0) -> str:
    """One row per setting, plain decoding first (the speedups divide by its tokens/s), then by K and T: tokens/s (the
    median of the repeats, with their range) and the speedup run by run (``PairedSpeedup``: the median, with the
    middle half of the runs), over plain decoding in the faster dtype (``share``: its step per run-dtype step)."""

    def order(s: Summary) -> tuple[int, ...]:
        d = s.setting.decode
        return (0,) if d is None else (1, d.drafts, d.steps)

    rows = sorted(run.summaries, key=order)
    paired = paired_speedups(run.measurements)
    lines = [
        "| setting | tokens/s (min–max) | speedup (middle half) | τ | same tokens as plain |",
        "|---|---|---|---|---|",
    ]
    for s in rows:
        name = "plain decoding (transformers generate)" if s.setting.method == REFERENCE else s.setting.label
        same = f"{s.checked - s.mismatches}/{s.checked}" if s.checked else "-"
        if s.mismatches:
            same += " ✗" if exact_tokens else " (rounding)"
        speedup = paired.get((s.setting, s.temperature))
        ratio = f"×{share:.2f}"  # plain decoding in the run dtype
        if speedup:
            ratio = f"×{share * speedup.median:.2f} ({share * speedup.low:.2f}–{share * speedup.high:.2f})"
        lines.append(
            f"| {name} | {s.tokens_per_s:.1f} ({s.tokens_per_s_min:.1f}–{s.tokens_per_s_max:.1f}) | {ratio} | "
            f"{s.tau:.2f} | {same} |"
        )
    return "\n".join(lines)


# --- a sweep as a GPU call ----------------------------------------------------------------------------------------


def load_for_sweep(cache: ModelCache, request: SweepRequest, message: str | None) -> None:
    """The web process's part of a sweep, before a GPU is attached: the request checked, the models loaded (downloads
    included; no forward runs)."""
    request.grid()
    sweep_prompts(request, message)
    cache.load(request.preset)


def sweep_on_gpu(
    request: SweepRequest, message: str | None, budget: Budget, ticket: StopTicket
) -> Iterator[tuple[int, int, str] | Calibration | SweepView | XpressError]:
    """The sweep as a GPU function runs it (plain data in, on the models this process serves): its progress (runs
    done, runs in all, setting) as it goes, then its view, each pickled back on ZeroGPU; a refusal is yielded, not
    raised (ZeroGPU would pass on only the name of an exception's class). The benchmark reports progress by calling
    back, so it measures in a thread of its own and this generator relays."""
    events: queue.Queue = queue.Queue()
    abandoned = threading.Event()  # the caller closed the stream: the sweep ends after its current run

    def measure() -> None:
        try:
            stop = lambda: ticket.requested() or abandoned.is_set()
            events.put(run_sweep(served(), request, message, lambda *done: events.put(done), stop, budget))
        except BaseException as error:  # noqa: BLE001 (raised again in the caller's thread)
            events.put(error)

    fresh = not served().is_ready(request.preset)
    threading.Thread(target=measure, name="xpress-sweep", daemon=True).start()
    try:
        while isinstance(item := events.get(), tuple):
            yield item
    finally:
        abandoned.set()
    if isinstance(item, BaseException) and not isinstance(item, XpressError):
        raise item
    if fresh and (measured := served().calibration(request.preset)) is not None:
        yield measured  # ``reply_on_gpu`` says why
    yield item


def sweep_seconds(request: SweepRequest, message: str | None, budget: Budget, ticket: StopTicket) -> float:
    """The GPU time to ask for a sweep (its request checked already): every setting and the plain baseline, on every
    prompt, as often as it repeats, within the request's budget."""
    settings = len(request.grid())
    runs = (settings + 1) * request.prompt_count * request.repeats(settings)
    return GPU_SETUP_S + min(runs * int(request.max_new_tokens) * GPU_TOKEN_S, budget.wall_s)


# ZeroGPU attaches a GPU for each sweep, as for each reply.
sweep_turn = on_gpu(sweep_on_gpu, duration=sweep_seconds)
