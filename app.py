"""xPress app: chat with a target LM while a diffusion drafter speculates, and watch what every round did.

Layout and event wiring. Decoding is ``xpress_core.engine.decode`` (one event per round, consumed here, never
re-implemented); figures come from ``xpress_core.plots``. ``python app.py --help`` lists the options; each has an
environment variable (see ``ENV``) so that a Hugging Face Space can set them.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # set before Gradio is imported: no telemetry

try:  # ZeroGPU Spaces need `spaces` imported before torch touches CUDA; elsewhere the package is absent
    import spaces
except ImportError:
    spaces = None

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import gradio as gr
import torch

from xpress_core import bench, plots
from xpress_core.bench_figures import HEATMAP_METRICS, heatmap
from xpress_core.config import REFINE_MODES, VERIFY_MODES, DecodeConfig
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import Models, context_limit, decode
from xpress_core.errors import XpressError
from xpress_core.models import (
    EMBEDDED_AR_DRAFTER,
    EMBEDDED_DRAFTER,
    EMBEDDED_GAUSS_DRAFTER,
    EMBEDDED_TARGET,
    NO_DRAFTER,
    DrafterOptions,
    encode_prompt,
    load_drafter,
    load_target,
    resolve_device,
    resolve_dtype,
)
from xpress_core.presets import ALLOW_UNKNOWN_ENV, TRUST_REMOTE_CODE_ENV, Access, hub_presets, is_local
from xpress_core.presets import ModelPreset as Preset
from xpress_core.trace import DecodeResult, RoundTrace, write_jsonl
from xpress_core.train.cli import DEFAULT_DATA

ENV = {
    "target": "XPRESS_TARGET",  # a custom preset's target: local directory or Hub id
    "drafter": "XPRESS_DRAFTER",  # its drafter: directory, Hub id or "none"
    "device": "XPRESS_DEVICE",
    "dtype": "XPRESS_DTYPE",
    "device_map": "XPRESS_DEVICE_MAP",  # "auto": spread the target over all GPUs (accelerate)
    "allow_unknown": ALLOW_UNKNOWN_ENV,  # load Hub ids no preset names
    "trust_remote_code": TRUST_REMOTE_CODE_ENV,  # allow model code from a model repository (presets that need it)
    "concurrency": "XPRESS_CONCURRENCY",  # requests decoded at the same time; more wait in the queue
}
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 7860  # overridden by Gradio's GRADIO_SERVER_NAME / GRADIO_SERVER_PORT
DEFAULT_CONCURRENCY = 2
QUEUE_SIZE = 64

# UI limits: tighter than the engine's (DecodeConfig.validate) so that a CPU Space stays responsive.
UI_MAX_DRAFTS = 8
UI_MAX_BLOCK = 16
UI_MAX_NEW_TOKENS = 512
MAX_TEMPERATURE = 2.0
MAX_SEED = 2**31 - 1
MAX_MESSAGE_CHARS = 8000  # longer messages keep their end (the part a reply follows)

# Rendering may take at most this share of the wall time, so that watching barely slows decoding; the engine's own
# timings exclude it anyway (its clock stops while we hold an event). The reply's text streams more often than the
# figures, which cost far more to build, send and draw.
UI_TIME_SHARE = 0.05
TEXT_INTERVAL_S = 0.25
PANELS_INTERVAL_S = 1.0
ANIMATION_FRAME_S = 0.2  # pause per denoise step when "animate" is on
CLEAR_WAIT_S = 5.0  # Clear waits this long at most for a running reply to notice it

SPECULATIVE, PLAIN = "speculative", "plain"
EMBEDDED_PRESET = "Embedded · diffusion drafter"
EMBEDDED_GAUSS_PRESET = "Embedded · gaussian diffusion drafter"
EMBEDDED_AR_PRESET = "Embedded · autoregressive drafter"
CUSTOM_PRESET = "Custom (--target / --drafter)"
EMPTY_MESSAGE = "Type a message first: an empty or blank message has nothing to answer."

HELP = {
    "preset": (
        "Target LM + drafter. Loaded on first use, then shared read-only by all users. The diffusion drafters: "
        "masked (positions start as MASK) or gaussian (token embeddings start as Gaussian noise)."
    ),
    "drafts": "K candidate drafts per round, refined together and verified together as one token tree.",
    "block": "L tokens per draft: a round accepts at most L draft tokens, plus one token from the target.",
    "steps": (
        "T denoise steps per round (1..L). T=1 fills the block in one drafter forward; "
        "T=L commits one position per step, like autoregressive drafting (which the AR drafter always does)."
    ),
    "temperature": "0 = greedy. Above 0 the target samples, and the output distribution is still exactly its own.",
    "top_p": "Nucleus cut-off, applied exactly as plain sampling applies it (only with temperature > 0).",
    "seed": "Same seed and settings give the same text, with or without the drafter.",
    "max_new_tokens": "Upper bound on the reply length, in tokens.",
    "refine": (
        "parallel: the K drafts share one batched drafter forward per step (about T forwards); "
        "serial: one draft at a time (K x T forwards). Same drafts, different cost."
    ),
    "verify": (
        "tree: drafts merged into a trie, checked in one target forward with a tree attention mask; "
        "batch: K rows over copies of the cache (simpler, K x the memory)."
    ),
    "race": (
        "Also decode the request plainly (no drafter) and compare speeds. The two runs take turns; "
        "each one's timings count only its own work."
    ),
    "animate": (
        "Replay every round's denoise steps in the draft panel while generating. Slower to watch; "
        "the timings shown exclude it."
    ),
}

INTRO = """# xPress · speculative decoding with a diffusion drafter
A small **drafter** proposes K drafts of L tokens by denoising masked blocks in T steps; the **target** LM checks all
of them in one forward and keeps the longest prefix it agrees with, plus one token of its own. The reply is exactly
what the target alone would write (same seed, same text): only faster when the drafts are good.
"""

PANEL_HELP = """
- **Draft evolution**: rows are the K drafts, columns the L block positions. Grey cells are still masked; colour is
  the drafter's confidence. After the last step the cells the target accepted get a green frame and each draft's first
  rejected token a red one; ★ marks the draft on the chosen path. Scrub any round and step with the sliders.
  With the gaussian drafter no cell is masked: every step shows each position's nearest token at that noise level.
- **Accepted length**: draft tokens accepted per round (grey dots: each draft; green: the chosen path), the running
  τ (tokens emitted per round, the speed-up's upper bound) and a histogram.
- **Latency**: time per round split into draft / verify / other (round 0 is the prompt's prefill), and tokens/s so far,
  beside plain decoding when Race is on. Times are the engine's own: rendering is excluded.
- **Token provenance**: the reply, each token coloured by where it came from: an accepted draft token or the target's
  own token (the one each round adds after the accepted path). Shades alternate with the round.
"""


# --- Models --------------------------------------------------------------------------------------------------------


def preset_problem(preset: Preset, access: Access) -> str | None:
    """Why the preset cannot load, found without loading anything: a missing local directory, or model code from a
    repository that the user has not allowed."""
    for role, spec in (("target", preset.target), ("drafter", preset.drafter)):
        local = Path(spec).is_absolute() or spec.startswith((".", "~"))
        if spec != NO_DRAFTER and local and not Path(spec).expanduser().exists():
            return f"the {role} directory {spec} does not exist"
    if preset.remote_code and not access.trust_remote_code:
        return "its drafter runs model code from its repository; start the app with --trust-remote-code if you trust it"
    return None


def unavailable(preset: Preset, problem: str) -> str:
    return (
        f"Model preset “{preset.name}” is not available: {problem}. Choose another preset, or start the app with "
        f"--target/--drafter (or {ENV['target']}/{ENV['drafter']}) pointing to your models."
    )


@dataclass(frozen=True)
class AppConfig:
    presets: tuple[Preset, ...]  # the first one is selected at start
    device: str = "auto"
    dtype: str = "auto"
    concurrency: int = DEFAULT_CONCURRENCY
    device_map: str | None = None
    access: Access = field(default_factory=Access)


def default_presets(target: str | None = None, drafter: str | None = None) -> tuple[Preset, ...]:
    """The embedded presets, then the Hub presets (downloaded on first use); a custom one first when a target or
    drafter was given."""
    embedded = (
        Preset(EMBEDDED_PRESET, str(EMBEDDED_TARGET), str(EMBEDDED_DRAFTER)),
        Preset(EMBEDDED_GAUSS_PRESET, str(EMBEDDED_TARGET), str(EMBEDDED_GAUSS_DRAFTER)),
        Preset(EMBEDDED_AR_PRESET, str(EMBEDDED_TARGET), str(EMBEDDED_AR_DRAFTER)),
    )
    if target is None and drafter is None:
        return embedded + hub_presets()
    custom = Preset(CUSTOM_PRESET, target or str(EMBEDDED_TARGET), drafter or str(EMBEDDED_DRAFTER))
    return (custom,) + embedded + hub_presets()


class TokenTexts:
    """Display text of token ids, memoised (figures ask for the same ids again and again)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.memo: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        if token not in self.memo:
            text = self.tokenizer.decode([token])
            # A lone piece of a multi-byte character decodes to U+FFFD; its raw vocabulary entry tells tokens apart.
            self.memo[token] = text if "\ufffd" not in text else self.tokenizer.convert_ids_to_tokens(token)
        return self.memo[token]


@dataclass(frozen=True)
class Loaded:
    speculative: Models
    plain: Models  # the same target without a drafter: the Race
    token_text: TokenTexts

    @property
    def block_limit(self) -> int:
        """The largest block L the UI offers: the drafter's trained block size, if it has one, within the UI's cap."""
        return min(UI_MAX_BLOCK, self.speculative.drafter.max_block or UI_MAX_BLOCK)


class ModelCache:
    """Loads each preset once, on first use, and shares it read-only across requests (targets shared by presets)."""

    def __init__(self, config: AppConfig):
        self.presets = {p.name: p for p in config.presets}
        self.device, self.dtype, self.device_map = config.device, config.dtype, config.device_map
        self.access = config.access
        self._targets: dict[str, tuple] = {}
        self._loaded: dict[str, Loaded] = {}
        self._lock = threading.Lock()  # one load at a time: two first requests must not load the same model twice

    def preset(self, name: str) -> Preset:
        if name not in self.presets:
            raise XpressError(f"unknown model preset {name!r}; choose one of: {', '.join(self.presets)}")
        return self.presets[name]

    def is_loaded(self, name: str) -> bool:
        return name in self._loaded

    def describe(self, name: str) -> str:
        """A line about the preset for the UI, without loading it."""
        preset = self.preset(name)
        problem = preset_problem(preset, self.access)
        if problem:
            return f"⚠ {unavailable(preset, problem)}"
        hub = not (is_local(preset.target) and (preset.drafter == NO_DRAFTER or is_local(preset.drafter)))
        where = "downloaded from the Hub and loaded on first use" if hub else "loaded on first use"
        needs = f" · needs: {preset.hardware}" if preset.hardware else ""
        return f"target `{preset.target}` · drafter `{preset.drafter}` · {where}{needs}"

    def get(self, name: str) -> Loaded:
        if name in self._loaded:
            return self._loaded[name]
        preset = self.preset(name)
        problem = preset_problem(preset, self.access)
        if problem:
            raise XpressError(unavailable(preset, problem))
        with self._lock:
            if name not in self._loaded:
                try:
                    self._loaded[name] = self._load(preset)
                except XpressError as error:
                    raise XpressError(unavailable(preset, str(error))) from error
        return self._loaded[name]

    def _load(self, preset: Preset) -> Loaded:
        device = resolve_device(self.device)
        dtype = resolve_dtype(self.dtype, device)
        if preset.target not in self._targets:
            self._targets[preset.target] = load_target(preset.target, device, dtype, self.device_map, self.access)
        target, tokenizer = self._targets[preset.target]
        options = DrafterOptions(kind=preset.drafter_kind)
        drafter = load_drafter(preset.drafter, target, tokenizer, target.device, dtype, options, self.access)
        return Loaded(Models(target, tokenizer, drafter), Models(target, tokenizer, NoDrafter()), TokenTexts(tokenizer))


# --- Settings and prompt -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """The controls' values as the UI (or an API client) sends them; checked by ``decode_config``."""

    preset: str = ""
    drafts: int = 4
    steps: int = 2
    block: int = 8
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 128
    refine: str = REFINE_MODES[0]
    verify: str = VERIFY_MODES[0]
    race: bool = False
    animate: bool = False

    def decode_config(self) -> DecodeConfig:
        whole = {
            "drafts K": (self.drafts, 1, UI_MAX_DRAFTS),
            "block L": (self.block, 1, UI_MAX_BLOCK),
            "denoise steps T": (self.steps, 1, UI_MAX_BLOCK),
            "max new tokens": (self.max_new_tokens, 1, UI_MAX_NEW_TOKENS),
            "seed": (self.seed, 0, MAX_SEED),
        }
        check_whole_numbers(whole)
        for name, value in (("temperature", self.temperature), ("top-p", self.top_p)):
            if not is_number(value):
                raise XpressError(f"{name} must be a number, got {value!r}")
        return DecodeConfig(
            drafts=int(self.drafts),
            steps=int(self.steps),
            block=int(self.block),
            temperature=float(self.temperature),
            top_p=float(self.top_p),
            seed=int(self.seed),
            max_new_tokens=int(self.max_new_tokens),
            refine=self.refine,
            verify=self.verify,
        ).validate()


DEFAULTS = Settings()


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_whole_numbers(ranges: dict[str, tuple]) -> None:
    """Each ``name: (value, low, high)`` must be a whole number within low..high (UI and API input alike)."""
    for name, (value, low, high) in ranges.items():
        if not (is_number(value) and float(value).is_integer() and low <= value <= high):
            raise XpressError(f"{name} must be a whole number in {low}..{high}, got {value!r}")


def history_messages(history: list[dict] | None) -> list[dict[str, str]]:
    """Chatbot history -> chat-template messages. Gradio 6 sends content as a list of parts; keep the text ones."""
    messages = []
    for message in history or []:
        content = message["content"]
        if not isinstance(content, str):
            parts = content if isinstance(content, list) else [content]
            content = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text")
        messages.append({"role": message["role"], "content": content})
    return messages


@dataclass(frozen=True)
class Prompt:
    ids: torch.Tensor  # (1, n)
    notice: str | None  # what was cut to make it fit, for the user


def fit_prompt(tokenizer, messages: list[dict[str, str]], limit: int | None, max_new_tokens: int) -> Prompt:
    """Encode with the chat template; if too long for the target's context, cut from the left (oldest first).

    The prompt may use the context minus room for the reply (``max_new_tokens``, but at most half the context).
    """
    cuts = []
    last = messages[-1]["content"]
    if len(last) > MAX_MESSAGE_CHARS:
        messages = messages[:-1] + [{"role": "user", "content": last[-MAX_MESSAGE_CHARS:]}]
        cuts.append(f"your message was cut to its last {MAX_MESSAGE_CHARS} characters")
    ids = encode_prompt(tokenizer, messages, chat=True)
    budget = None if limit is None else limit - min(max_new_tokens, limit // 2)
    if budget is not None and ids.shape[1] > budget:
        dropped = 0
        while ids.shape[1] > budget and len(messages) > 1:
            messages = messages[1:]
            dropped += 1
            while len(messages) > 1 and messages[0]["role"] != "user":  # a conversation starts with the user
                messages = messages[1:]
                dropped += 1
            ids = encode_prompt(tokenizer, messages, chat=True)
        if dropped:
            cuts.append(f"the {dropped} oldest messages were left out")
        if ids.shape[1] > budget:
            messages, ids = cut_last_message(tokenizer, messages, budget)
            cuts.append(f"your message was cut to its last {len(messages[-1]['content'])} characters")
    notice = None
    if cuts:
        room = "" if limit is None else f" (the target's context holds {limit} tokens, {budget} of them for the prompt)"
        notice = "Long prompt: " + "; ".join(cuts) + room + "."
    return Prompt(ids, notice)


def cut_last_message(tokenizer, messages: list[dict[str, str]], budget: int):
    """Keep the longest end of the last message whose prompt fits ``budget`` tokens (binary search on characters)."""
    head, text = messages[:-1], messages[-1]["content"]

    def encoded(chars: int):
        return encode_prompt(tokenizer, head + [{"role": "user", "content": text[-chars:]}], chat=True)

    low, high = 1, len(text)  # invariant: the answer is in [low, high] once low fits
    if encoded(low).shape[1] > budget:
        raise XpressError(
            f"the chat template alone does not fit the {budget} prompt tokens the target's context allows"
        )
    while low < high:
        mid = (low + high + 1) // 2
        if encoded(mid).shape[1] <= budget:
            low = mid
        else:
            high = mid - 1
    kept = head + [{"role": "user", "content": text[-low:]}]
    return kept, encode_prompt(tokenizer, kept, chat=True)


def check_block(block: int, loaded: Loaded, preset: str) -> None:
    """Refuse a block L beyond what the preset's drafter was trained for, before any decoding starts."""
    if block > loaded.block_limit:
        raise XpressError(
            f"block L={block} is longer than the drafter of “{preset}” was trained for: choose L ≤ {loaded.block_limit}"
        )


def block_slider(cache: ModelCache, preset: str, value) -> dict:
    """The block L slider capped at the preset's limit once its models are loaded (the drafter's trained block size is
    known then); the UI's cap before."""
    limit = cache.get(preset).block_limit if cache.is_loaded(preset) else UI_MAX_BLOCK
    return gr.update(maximum=limit, value=min(int(value), limit))


# --- One reply -----------------------------------------------------------------------------------------------------


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
            history=self.chat(), status=self.status(), plain=self.text(PLAIN) if self.race else None, reply=self.reply()
        )

    def view(self, done: bool = False, **extra) -> View:
        traces, plain = self.traces[SPECULATIVE], self.traces[PLAIN]
        token_text = self.loaded.token_text
        return replace(
            self.text_view(),
            evolution=plots.draft_evolution_figure(traces[-1], token_text) if traces else None,
            accept=plots.accept_length_figure(traces),
            latency=plots.latency_figure(traces, plain),
            provenance=plots.provenance_figure(traces, token_text),
            done=done,
            **extra,
        )

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
                f"τ = {result.mean_accept_len:.2f} tokens/round · {result.tokens_per_s:.1f} tokens/s** "
                f"(engine time, rendering excluded: prefill {1000 * result.prefill_s:.0f} ms · {split}) "
                f"· stop: {result.stop_reason}"
            )
            if self.wall_s and not self.race:  # with Race the wall clock holds both runs
                lines.append(f"Wall clock with the UI: {result.new_tokens / self.wall_s:.1f} tokens/s.")
        elif traces:
            last = traces[-1]
            tau = plots.running_tau(traces[1:])[-1] if len(traces) > 1 else 0.0
            progress = f"{last.new_tokens_total} tokens · τ = {tau:.2f} · {last.tokens_per_s:.1f} tokens/s"
            lines.append(f"■ Stopped after {progress}" if self.stopped else f"… round {last.index} · {progress}")
        if self.race:
            lines.append(self.race_line())
        return "\n\n".join(lines)

    def race_line(self) -> str:
        spec, plain = self.traces[SPECULATIVE], self.traces[PLAIN]
        if not plain:
            return "Race · plain decoding: starting"
        plain_speed = plain[-1].tokens_per_s
        spec_speed = spec[-1].tokens_per_s if spec else 0.0
        line = f"Race · plain decoding: {plain_speed:.1f} tokens/s"
        if plain_speed > 0 and spec_speed > 0:
            line += f" → speculative is ×{spec_speed / plain_speed:.2f}"
        if len(self.results) == 2:
            same = self.results[SPECULATIVE].token_ids == self.results[PLAIN].token_ids
            line += " · same tokens ✓" if same else " · the outputs differ ✗"
        return line


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


def advance(run: Iterator):
    """Next engine event with autograd off in *this* thread: Gradio resumes a generator on any worker thread, and
    grad mode is thread-local, so the engine's own ``no_grad`` would not carry over."""
    with torch.no_grad():
        return next(run)


def race(runs: dict[str, Iterator]) -> Iterator[tuple[str, RoundTrace | DecodeResult]]:
    """Interleave the runs' events, always advancing the one that has spent less engine time: both progress as they
    would side by side, and each engine's clock counts only its own work."""
    spent = {name: 0.0 for name in runs}
    try:
        while spent:
            name = min(spent, key=spent.get)
            event = advance(runs[name])
            if isinstance(event, DecodeResult):
                del spent[name]
            else:
                spent[name] = event.elapsed_s
            yield name, event
    finally:
        for run in runs.values():
            run.close()


def never() -> bool:
    return False


def run_chat(
    cache: ModelCache,
    message: str | None,
    history: list[dict] | None,
    settings: Settings,
    stop_requested: Callable[[], bool] = never,
) -> Iterator[View]:
    """Answer one chat message: stream views while the engine decodes (and, with Race, plain decoding beside it).

    ``stop_requested`` is polled between rounds and animation frames; when it turns true the reply ends there, with a
    last view of what was decoded so far.
    """
    text = (message or "").strip()
    if not text:
        yield View(message="", status=EMPTY_MESSAGE, notice=EMPTY_MESSAGE)
        return
    cfg = settings.decode_config()
    if stop_requested():  # stopped or cleared while waiting in the queue
        return
    if not cache.is_loaded(settings.preset):
        yield View(message="", status=f"Loading “{settings.preset}”…")
    loaded = cache.get(settings.preset)
    check_block(cfg.block, loaded, settings.preset)
    past = history_messages(history)
    prompt = fit_prompt(
        loaded.speculative.tokenizer,
        past + [{"role": "user", "content": text}],
        context_limit(loaded.speculative.target),
        cfg.max_new_tokens,
    )
    runs = {SPECULATIVE: decode(loaded.speculative, prompt.ids, cfg)}
    if settings.race:
        runs[PLAIN] = decode(loaded.plain, prompt.ids, cfg)
    board = Board(loaded, past, text, settings.race, prompt.notice)
    panels, text_only = Throttle(PANELS_INTERVAL_S), Throttle(TEXT_INTERVAL_S)
    with panels.rendering():
        yield board.view(message="", notice=prompt.notice)
    with closing(race(runs)) as events:
        for run, event in events:
            board.add(run, event)
            if stop_requested():
                board.stopped = True
                break
            if isinstance(event, DecodeResult):
                continue
            if settings.animate and run == SPECULATIVE and event.steps:
                yield from animation(board, event, stop_requested)
            if panels.due():
                with panels.rendering():
                    yield board.view()
            elif text_only.due():
                with text_only.rendering():
                    yield board.text_view()
    yield board.view(done=True)


def animation(board: Board, trace: RoundTrace, stop_requested: Callable[[], bool]) -> Iterator[View]:
    """One frame per denoise step of the round in the draft panel; the last frame also brings the round's text."""
    for step in range(len(trace.steps)):
        if stop_requested():
            return
        frame = View(evolution=plots.draft_evolution_figure(trace, board.loaded.token_text, step))
        if step == len(trace.steps) - 1:
            frame = replace(frame, history=board.chat(), status=board.status(), reply=board.reply())
        yield frame
        time.sleep(ANIMATION_FRAME_S)


def log_file(reply: Reply, directory: Path) -> str:
    """The reply's per-round JSONL log, in a file of its own (downloads may overlap)."""
    handle, path = tempfile.mkstemp(prefix="xpress-rounds-", suffix=".jsonl", dir=directory)
    with os.fdopen(handle, "w") as out:
        write_jsonl(list(reply.traces), out)
    return path


def scrub_figure(reply: Reply | None, round_index, step):
    """The draft panel for any round (0 = the prefill) and denoise step (from 1) of the last reply."""
    if reply is None or not reply.traces:
        return plots.message_figure(plots.EVOLUTION_TITLE, "Send a message first.")
    trace = reply.traces[min(max(int(round_index), 0), len(reply.traces) - 1)]
    return plots.draft_evolution_figure(trace, reply.token_text, int(step) - 1)


class Controls:
    """A browser session's Stop/Clear requests, read by its running reply between rounds.

    Gradio's own cancellation would kill the generator while its next update may still be on the way, so a stop could
    land before the last frames; a reply that ends itself sends its final view after everything else.
    """

    def __init__(self):
        self.stop = False
        self.running = 0  # replies of this session being decoded

    def arm(self) -> None:
        """A new run starts: forget an earlier stop."""
        self.stop = False

    def request_stop(self) -> None:
        self.stop = True

    def wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.running and time.monotonic() < deadline:
            time.sleep(0.02)


# ZeroGPU attaches a GPU for each call of the decorated function; elsewhere it runs as is.
chat_turn = spaces.GPU(run_chat) if spaces is not None else run_chat


# --- Sweep ---------------------------------------------------------------------------------------------------------
# The Sweep tab: a small (K, T) grid measured live on the preset's models by the benchmark's own ``bench.sweep``
# (transformers generate as the plain-decoding baseline, every output checked against it), drawn with the
# benchmark's heatmap builders.

HELD_OUT, CHAT_BOX = "held-out prompts", "the chat box text"
SWEEP_SOURCES = (HELD_OUT, CHAT_BOX)
SWEEP_MAX_PROMPTS = 8
SWEEP_MAX_NEW_TOKENS = 256
# Grid settings x prompts at most: with the warm-up and the baseline, a sweep on the embedded models then stays
# within a few minutes on a 2-core CPU Space.
SWEEP_MAX_RUNS = 48

SWEEP_HELP = """Measures tokens/s and τ over a grid of drafts K × denoise steps T at one block length L, on the model
preset chosen in the Chat tab, against plain decoding (transformers `generate`) on the same prompts. Every setting
first runs once to warm up, then once per prompt, greedy; each output is compared with plain decoding's. Replies
being decoded meanwhile share the machine and slow the numbers down."""


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
        if self.source not in SWEEP_SOURCES:
            raise XpressError(f"prompts come from {' or '.join(SWEEP_SOURCES)}, got {self.source!r}")
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


@dataclass(frozen=True)
class SweepView:
    """The Sweep tab's update. ``None`` leaves a component as it is."""

    status: str
    tokens_per_s: object | None = None  # plotly figures
    tau: object | None = None
    table: str | None = None  # markdown
    run: bench.BenchRun | None = None


class SweepCancelled(Exception):
    """Raised from the sweep's progress callback to end it between runs. Not an XpressError: the benchmark reports
    those as settings it could not run and goes on."""


def sweep_prompts(request: SweepRequest, message: str | None, data_dir: Path) -> tuple[tuple, str | None]:
    """The prompts to sweep on, and a note when the held-out chats are not there (a Space has no data folder)."""
    if request.source == CHAT_BOX:
        text = (message or "").strip()
        if not text:
            raise XpressError(
                "The chat box is empty: type a prompt there (no need to send it), or use held-out prompts."
            )
        return (text,), None
    if (data_dir / bench.SGD_DEV).exists():
        return bench.spread(bench.default_prompts(data_dir), request.prompts), None
    note = f"no held-out chats here ({data_dir / bench.SGD_DEV} is missing): the built-in story requests stand in"
    return bench.spread(bench.story_prompts(), request.prompts), note


def run_sweep(
    cache: ModelCache,
    request: SweepRequest,
    message: str | None,
    progress: bench.Progress | None = None,
    stop_requested: Callable[[], bool] = never,
    data_dir: Path = DEFAULT_DATA,
) -> SweepView:
    """Run the Sweep tab's grid with ``bench.sweep`` and build its heatmaps and table.

    ``progress`` gets (runs done, runs in all, setting); ``stop_requested`` is polled after every run and ends the
    sweep there.
    """
    grid = request.grid()
    prompts, note = sweep_prompts(request, message, data_dir)
    loaded = cache.get(request.preset)
    check_block(request.block, loaded, request.preset)
    if isinstance(loaded.speculative.drafter, NoDrafter):
        raise XpressError(f"“{request.preset}” has no drafter: there is nothing to sweep.")
    reached = [0, 0]

    def report(done: int, total: int, label: str) -> None:
        reached[:] = done, total
        if progress:
            progress(done, total, label)
        if stop_requested():
            raise SweepCancelled

    try:
        run = bench.sweep(
            loaded.speculative, prompts, grid, max_new_tokens=int(request.max_new_tokens), progress=report
        )
    except SweepCancelled:
        return SweepView(f"■ Sweep stopped after {reached[0]} of {reached[1]} runs: nothing measured to show.")
    return SweepView(
        status=sweep_status(run, len(prompts), note),
        tokens_per_s=heatmap(run.summaries, "tokens_per_s"),
        tau=heatmap(run.summaries, "tau"),
        table=sweep_table(run),
        run=run,
    )


def sweep_status(run: bench.BenchRun, prompts: int, note: str | None) -> str:
    xpress = [s for s in run.summaries if s.setting.method == bench.XPRESS]
    lines = [f"⚠ {note}."] if note else []
    if xpress:
        best = max(xpress, key=lambda s: s.tokens_per_s)
        lines.append(
            f"✓ **settings: {len(xpress)} · prompts: {prompts} · best {best.setting.label}: "
            f"{best.tokens_per_s:.1f} tokens/s, ×{best.speedup:.2f} over plain decoding, τ = {best.tau:.2f}**"
        )
    lines += [f"⚠ {name} not run: {why}" for name, why in run.skipped]
    if run.mismatches:
        lines.append(f"✗ {len(run.mismatches)} outputs differ from plain decoding's (see the table).")
    elif xpress:
        lines.append("Every output equals plain decoding's, token for token.")
    return "\n\n".join(lines)


def sweep_table(run: bench.BenchRun) -> str:
    """One row per setting, plain decoding first (the speedups divide by its tokens/s), then by K and T."""

    def order(s: bench.Summary) -> tuple[int, ...]:
        d = s.setting.decode
        return (0,) if d is None else (1, d.drafts, d.steps)

    rows = sorted(run.summaries, key=order)
    lines = ["| setting | tokens/s | speedup | τ | same tokens as plain |", "|---|---|---|---|---|"]
    for s in rows:
        name = "plain decoding (transformers generate)" if s.setting.method == bench.REFERENCE else s.setting.label
        same = f"{s.checked - s.mismatches}/{s.checked}" if s.checked else "-"
        lines.append(f"| {name} | {s.tokens_per_s:.1f} | ×{s.speedup:.2f} | {s.tau:.2f} | {same} |")
    return "\n".join(lines)


# ZeroGPU attaches a GPU for each sweep, as for each reply.
sweep_turn = spaces.GPU(run_sweep) if spaces is not None else run_sweep


# --- Layout and wiring ---------------------------------------------------------------------------------------------


def int_slider(minimum: int, maximum: int, value: int, label: str, elem_id: str, **extra) -> gr.Slider:
    """A whole-number slider (step 1, no decimals): every count the app asks for."""
    return gr.Slider(minimum, maximum, value=value, step=1, precision=0, label=label, elem_id=elem_id, **extra)


def build_app(config: AppConfig, cache: ModelCache | None = None) -> gr.Blocks:
    cache = cache or ModelCache(config)
    names = list(cache.presets)
    log_dir = Path(tempfile.mkdtemp(prefix="xpress-logs-"))
    empty = {
        "evolution": plots.message_figure(plots.EVOLUTION_TITLE, "The drafts of each round appear here."),
        "accept": plots.message_figure(plots.ACCEPT_TITLE, "Accepted lengths appear here."),
        "latency": plots.message_figure(plots.LATENCY_TITLE, "Timings appear here."),
        "provenance": plots.message_figure(plots.PROVENANCE_TITLE, "The reply's tokens appear here.", height=160),
    }

    # The chat is the first tab; the Sweep tab is added beside it below (re-entering the Blocks), which keeps the
    # chat's layout as it was.
    with (
        gr.Blocks(title="xPress", analytics_enabled=False, delete_cache=(3600, 3600)) as demo,
        gr.Tabs() as tabs,
        gr.Tab("Chat", id="chat"),
    ):
        reply_state = gr.State(None)
        controls = gr.State(Controls())
        gr.Markdown(INTRO)
        with gr.Row():
            with gr.Column(scale=3):
                with gr.Row():
                    chatbot = gr.Chatbot(label="Chat", height=440, elem_id="chatbot", scale=3)
                    plain_box = gr.Textbox(
                        label="Race: plain decoding (no drafter)",
                        lines=18,
                        max_lines=18,
                        interactive=False,
                        visible=DEFAULTS.race,
                        elem_id="plain-reply",
                        scale=2,
                    )
                message = gr.Textbox(
                    show_label=False,
                    placeholder="Type a message and press Enter",
                    lines=1,
                    max_lines=6,
                    elem_id="message",
                )
                with gr.Row():
                    send = gr.Button("Send", variant="primary", elem_id="send")
                    stop = gr.Button("Stop", variant="stop", elem_id="stop")
                    clear = gr.Button("Clear", elem_id="clear")
                status = gr.Markdown(elem_id="status")
            with gr.Column(scale=2):
                preset = gr.Dropdown(names, value=names[0], label="Model preset", info=HELP["preset"], elem_id="preset")
                preset_note = gr.Markdown(elem_id="preset-note")
                drafts = int_slider(1, UI_MAX_DRAFTS, DEFAULTS.drafts, "Drafts K", "drafts", info=HELP["drafts"])
                block = int_slider(1, UI_MAX_BLOCK, DEFAULTS.block, "Block L", "block", info=HELP["block"])
                steps = int_slider(1, DEFAULTS.block, DEFAULTS.steps, "Denoise steps T", "steps", info=HELP["steps"])
                with gr.Row():
                    temperature = gr.Slider(
                        0.0,
                        MAX_TEMPERATURE,
                        value=DEFAULTS.temperature,
                        step=0.05,
                        label="Temperature",
                        info=HELP["temperature"],
                        elem_id="temperature",
                    )
                    top_p = gr.Slider(
                        0.05, 1.0, value=DEFAULTS.top_p, step=0.05, label="Top-p", info=HELP["top_p"], elem_id="top-p"
                    )
                with gr.Row():
                    seed = gr.Number(
                        DEFAULTS.seed,
                        precision=0,
                        minimum=0,
                        maximum=MAX_SEED,
                        label="Seed",
                        info=HELP["seed"],
                        elem_id="seed",
                    )
                    max_new_tokens = int_slider(
                        1,
                        UI_MAX_NEW_TOKENS,
                        DEFAULTS.max_new_tokens,
                        "Max new tokens",
                        "max-new-tokens",
                        info=HELP["max_new_tokens"],
                    )
                refine = gr.Radio(
                    list(REFINE_MODES), value=DEFAULTS.refine, label="Refinement", info=HELP["refine"], elem_id="refine"
                )
                verify = gr.Radio(
                    list(VERIFY_MODES),
                    value=DEFAULTS.verify,
                    label="Verification",
                    info=HELP["verify"],
                    elem_id="verify",
                )
                with gr.Row():
                    race_box = gr.Checkbox(
                        DEFAULTS.race, label="Race plain decoding", info=HELP["race"], elem_id="race"
                    )
                    animate = gr.Checkbox(
                        DEFAULTS.animate, label="Animate denoising", info=HELP["animate"], elem_id="animate"
                    )
        evolution = gr.Plot(empty["evolution"], label="Draft evolution", elem_id="plot-evolution")
        with gr.Row():
            round_slider = int_slider(0, 1, 1, "Round (0 = prefill)", "round-slider")
            step_slider = int_slider(1, 2, 1, "Denoise step", "step-slider")
        with gr.Row():
            accept = gr.Plot(empty["accept"], label="Accepted length", elem_id="plot-accept")
            latency = gr.Plot(empty["latency"], label="Latency", elem_id="plot-latency")
        provenance = gr.Plot(empty["provenance"], label="Token provenance", elem_id="plot-provenance")
        download = gr.DownloadButton("Download the round log (JSONL)", value=None, elem_id="download-log")
        with gr.Accordion("How to read the panels", open=False):
            gr.Markdown(PANEL_HELP)

        outputs = [
            message,
            chatbot,
            status,
            plain_box,
            evolution,
            accept,
            latency,
            provenance,
            reply_state,
            round_slider,
            step_slider,
            download,
        ]

        def finished(reply: Reply) -> list:
            """Sliders spanning the reply's rounds and steps, and its log."""
            return [
                gr.update(maximum=max(1, reply.rounds), value=reply.rounds),
                gr.update(maximum=max(2, reply.max_steps), value=reply.max_steps),  # a slider needs min < max
                gr.update(value=log_file(reply, log_dir)),
            ]

        def render(view: View) -> list:
            if view.notice:
                gr.Warning(view.notice)
            fields = [
                view.message,
                view.history,
                view.status,
                view.plain,
                view.evolution,
                view.accept,
                view.latency,
                view.provenance,
                view.reply,
            ]
            tail = finished(view.reply) if view.done and view.reply is not None else [gr.skip()] * 3
            return [gr.skip() if value is None else value for value in fields] + tail

        def respond(
            message,
            history,
            preset,
            drafts,
            steps,
            block,
            temperature,
            top_p,
            seed,
            max_new_tokens,
            refine,
            verify,
            race,
            animate,
            controls: Controls,
        ):
            settings = Settings(
                preset, drafts, steps, block, temperature, top_p, seed, max_new_tokens, refine, verify, race, animate
            )
            controls.running += 1
            try:
                for view in chat_turn(cache, message, history, settings, lambda: controls.stop):
                    yield render(view)
            except XpressError as error:
                raise gr.Error(str(error)) from error
            finally:
                controls.running -= 1

        def cleared(controls: Controls) -> list:
            controls.stop = True
            controls.wait_idle(CLEAR_WAIT_S)  # its last update goes out before this one
            return [
                "",
                [],
                "",
                "",
                empty["evolution"],
                empty["accept"],
                empty["latency"],
                empty["provenance"],
                None,
                gr.update(maximum=1, value=1),
                gr.update(maximum=2, value=1),
                gr.update(value=None),
            ]

        inputs = [
            message,
            chatbot,
            preset,
            drafts,
            steps,
            block,
            temperature,
            top_p,
            seed,
            max_new_tokens,
            refine,
            verify,
            race_box,
            animate,
            controls,
        ]
        chat_event = gr.on([message.submit, send.click], Controls.arm, controls, None, queue=False, api_visibility="private")
        reply_event = chat_event.then(respond, inputs, outputs, api_name="chat", show_progress="minimal")
        stop.click(Controls.request_stop, controls, None, queue=False, api_visibility="private")
        clear.click(cleared, controls, outputs, queue=False, api_visibility="private")
        for slider in (round_slider, step_slider):
            slider.input(
                scrub_figure,
                [reply_state, round_slider, step_slider],
                evolution,
                trigger_mode="always_last",
                concurrency_limit=None,
                show_progress="hidden",
                api_visibility="private",
            )
        block.change(
            lambda length, t: gr.update(maximum=length, value=min(t, length)),
            [block, steps],
            steps,
            queue=False,
            api_visibility="private",
        )
        race_box.change(lambda on: gr.update(visible=on), race_box, plain_box, queue=False, api_visibility="private")
        preset.change(cache.describe, preset, preset_note, queue=False, api_visibility="private")
        demo.load(cache.describe, preset, preset_note, queue=False, api_visibility="private")
        # Block L never offers more than the drafter was trained for: capped whenever the preset's models may have
        # just loaded (a reply, a page load, another preset).
        for cap_trigger in (reply_event.then, preset.change, demo.load):
            cap_trigger(partial(block_slider, cache), [preset, block], block, queue=False, api_visibility="private")
    with demo, tabs, gr.Tab("Sweep", id="sweep") as sweep:
        sweep_tab(demo, sweep, cache, preset, message, block)
    demo.queue(default_concurrency_limit=config.concurrency, max_size=QUEUE_SIZE)
    return demo


def sweep_tab(
    demo: gr.Blocks, tab: gr.Tab, cache: ModelCache, preset: gr.Dropdown, message: gr.Textbox, chat_block: gr.Slider
) -> None:
    """The Sweep tab's layout and events, inside ``tab``; the preset, the chat box and the chat's block L slider are
    the Chat tab's."""
    defaults = SweepRequest()
    controls = gr.State(Controls())
    gr.Markdown(SWEEP_HELP)
    with gr.Row():
        drafts = gr.CheckboxGroup(
            list(range(1, UI_MAX_DRAFTS + 1)), value=list(defaults.drafts), label="Drafts K", elem_id="sweep-drafts"
        )
        steps = gr.CheckboxGroup(
            list(range(1, UI_MAX_BLOCK + 1)),
            value=list(defaults.steps),
            label="Denoise steps T",
            info="Values above L are left out.",
            elem_id="sweep-steps",
        )
    with gr.Row():
        block = int_slider(1, UI_MAX_BLOCK, defaults.block, "Block L", "sweep-block")
        source = gr.Radio(list(SWEEP_SOURCES), value=defaults.source, label="Prompts", elem_id="sweep-source")
        count = int_slider(
            1,
            SWEEP_MAX_PROMPTS,
            defaults.prompts,
            "Held-out prompts",
            "sweep-prompts",
            info="How many, spread over the benchmark's held-out chats and story requests.",
            visible=defaults.source == HELD_OUT,
        )
        max_new_tokens = int_slider(
            1, SWEEP_MAX_NEW_TOKENS, defaults.max_new_tokens, "Max new tokens", "sweep-max-new-tokens"
        )
    with gr.Row():
        run = gr.Button("Run sweep", variant="primary", elem_id="sweep-run")
        stop = gr.Button("Stop", variant="stop", elem_id="sweep-stop")
    status = gr.Markdown(elem_id="sweep-status")
    with gr.Column():  # full width each: the heatmaps' titles are long
        tokens_plot = gr.Plot(
            plots.message_figure(HEATMAP_METRICS["tokens_per_s"], "Run a sweep: tokens/s over (K, T) appear here."),
            label="tokens/s",
            elem_id="sweep-heatmap-tokens",
        )
        tau_plot = gr.Plot(
            plots.message_figure(HEATMAP_METRICS["tau"], "Run a sweep: τ over (K, T) appears here."),
            label="τ",
            elem_id="sweep-heatmap-tau",
        )
    table = gr.Markdown(elem_id="sweep-table")

    def sweep(
        preset,
        drafts,
        steps,
        block,
        source,
        count,
        max_new_tokens,
        message,
        controls: Controls,
        progress=gr.Progress(),  # noqa: B008 (Gradio finds the progress tracker by this default value)
    ):
        request = SweepRequest(preset, tuple(drafts or ()), tuple(steps or ()), block, source, count, max_new_tokens)
        progress(0, desc="Loading the models and the prompts…")
        try:
            view = sweep_turn(
                cache,
                request,
                message,
                lambda done, total, label: progress((done, total), desc=f"runs · last: {label}", unit="runs"),
                lambda: controls.stop,
            )
        except XpressError as error:
            raise gr.Error(str(error)) from error
        fields = [view.status, view.tokens_per_s, view.tau, view.table]
        return [gr.skip() if value is None else value for value in fields]

    started = run.click(Controls.arm, controls, None, queue=False, api_visibility="private")
    # One sweep at a time: two at once would each measure the other's load.
    finished = started.then(
        sweep,
        [preset, drafts, steps, block, source, count, max_new_tokens, message, controls],
        [status, tokens_plot, tau_plot, table],
        api_name="sweep",
        concurrency_limit=1,
        concurrency_id="sweep",
    )
    stop.click(Controls.request_stop, controls, None, queue=False, api_visibility="private")
    source.change(
        lambda chosen: gr.update(visible=chosen == HELD_OUT), source, count, queue=False, api_visibility="private"
    )
    # Both block L sliders are capped once a sweep has loaded the models; this one also whenever the tab is opened (a
    # reply may have loaded them).
    cap = partial(block_slider, cache)
    for slider in (block, chat_block):
        finished.then(cap, [preset, slider], slider, queue=False, api_visibility="private")
    for cap_trigger in (tab.select, preset.change, demo.load):
        cap_trigger(cap, [preset, block], block, queue=False, api_visibility="private")


def parse_args(argv: list[str] | None = None) -> AppConfig:
    env = os.environ
    parser = argparse.ArgumentParser(description="xPress: the speculative decoding app (Gradio).")
    parser.add_argument(
        "--target",
        default=env.get(ENV["target"]),
        help=f"target of a custom preset: local directory or Hub id (env {ENV['target']})",
    )
    parser.add_argument(
        "--drafter",
        default=env.get(ENV["drafter"]),
        help=f"drafter of the custom preset: directory, Hub id or 'none' (env {ENV['drafter']})",
    )
    parser.add_argument(
        "--device", default=env.get(ENV["device"], "auto"), help=f"auto, cpu, cuda (env {ENV['device']})"
    )
    parser.add_argument(
        "--dtype",
        default=env.get(ENV["dtype"], "auto"),
        help=f"auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16 (env {ENV['dtype']})",
    )
    parser.add_argument(
        "--device-map",
        default=env.get(ENV["device_map"]),
        help=f"'auto': spread the target over all GPUs, for targets larger than one (env {ENV['device_map']})",
    )
    parser.add_argument(
        "--allow-unknown-models",
        action="store_true",
        help=f"load Hub ids that no preset names (env {ENV['allow_unknown']}=1)",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help=f"allow model code from a model's repository, for presets that need it (env {ENV['trust_remote_code']}=1)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=int(env.get(ENV["concurrency"], DEFAULT_CONCURRENCY)),
        help=f"requests decoded at the same time (env {ENV['concurrency']})",
    )
    args = parser.parse_args(argv)
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    access = Access.from_env(args.allow_unknown_models, args.trust_remote_code)
    return AppConfig(
        default_presets(args.target, args.drafter), args.device, args.dtype, args.concurrency, args.device_map, access
    )


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    cache = ModelCache(config)
    if spaces is not None and os.environ.get("SPACES_ZERO_GPU"):
        # ZeroGPU runs each request in a short-lived worker: models must be in place (on CUDA) before it forks.
        try:
            cache.get(config.presets[0].name)
        except XpressError as error:
            print(f"xPress: {error}", file=sys.stderr)  # the page says it again when the preset is used
    demo = build_app(config, cache)
    demo.launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", DEFAULT_HOST),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", DEFAULT_PORT)),
        share=False,
    )


if __name__ == "__main__":
    main()
