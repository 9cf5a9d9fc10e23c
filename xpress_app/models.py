"""The model cache: each preset's models loaded once, on first use, and shared read-only by every request.

Loading (``ModelCache.load``: download, weights, placement) runs no forward; calibrating (``ModelCache.get``: the
kernels warmed and the stage costs timed) does. On ZeroGPU the web process only loads, and CUDA work runs in the GPU
worker that ``spaces`` forks for each call (``zerogpu.py``), which reaches the models through ``served()``.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from xpress_core import engine, validation
from xpress_core.controller import CostModel
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import decode_to_end
from xpress_core.errors import XpressError
from xpress_core.hub import ModelSpec, is_local
from xpress_core.models import (
    NO_DRAFTER,
    DrafterOptions,
    Models,
    encode_prompt,
    load_drafter,
    load_target,
    measures_dtype,
    resolve_device,
    resolve_drafter,
    resolve_dtype,
    resolve_model,
    unmeasured,
    warm_kernels,
)
from xpress_core.precision import chosen_dtype
from xpress_core.presets import Access, ModelPreset
from xpress_core.verdict import CALIBRATION_TOKENS, calibrate_plain_step

from .activity import InFlight
from .config import ENV, AppConfig, Hardware
from .settings import DEFAULTS, UI_MAX_BLOCK

# Plain decoding is timed on this text at load (raw text, no chat template: a continuation rarely ends early).
CALIBRATION_TEXT = "Once upon a time"


def preset_problem(preset: ModelPreset, access: Access, hardware: Hardware) -> str | None:
    """Why the preset cannot load, found without loading (or downloading) anything: a missing local directory, model
    code from a repository that the user has not allowed, or hardware this server lacks."""
    if not preset.installed():
        return f"its target ships in the Python package {preset.package!r}, not installed here ({preset.hardware})"
    for role, spec in (("target", preset.target), ("drafter", preset.drafter)):
        local = Path(spec).is_absolute() or spec.startswith((".", "~"))
        if spec != NO_DRAFTER and local and not Path(spec).expanduser().exists():
            return f"the {role} directory {spec} does not exist"
    if preset.remote_code and not access.trust_remote_code:
        return "its drafter runs model code from its repository; start the app with --trust-remote-code if you trust it"
    if preset.needs_cuda and not hardware.cuda:
        return "it needs a CUDA GPU and this server runs on CPU"
    needed = preset.memory_gb * (2 if hardware.doubled else 1)
    if needed > hardware.memory_gb:
        return (
            f"its models need about {needed:.1f} GB and this server allows {hardware.memory_gb:.1f} GB "
            f"({ENV['memory_gb']})"
        )
    return None


def unavailable(preset: ModelPreset, problem: str) -> str:
    return (
        f"Model preset “{preset.name}” is not available: {problem}. Choose another preset, or start the app with "
        f"--target/--drafter (or {ENV['target']}/{ENV['drafter']}) pointing to your models."
    )


# Every TokenTexts of this process, by tokenizer name: a pickled one (a reply sent back from a ZeroGPU worker) is
# this process's own again, not a copy of its tokenizer.
_TOKEN_TEXTS: weakref.WeakValueDictionary[str, TokenTexts] = weakref.WeakValueDictionary()


class TokenTexts:
    """Display text of token ids, memoised (figures ask for the same ids again and again). Pickles as its tokenizer's
    name (``token_texts``): a reply crosses a process boundary without the tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.memo: dict[int, str] = {}
        _TOKEN_TEXTS[tokenizer.name_or_path] = self  # the newest: the one least likely to be unloaded soon

    def __reduce__(self):
        return token_texts, (self.tokenizer.name_or_path,)

    def __call__(self, token: int) -> str:
        if token not in self.memo:
            text = self.tokenizer.decode([token])
            # A lone piece of a multi-byte character decodes to U+FFFD; its raw vocabulary entry tells tokens apart.
            self.memo[token] = text if "\ufffd" not in text else self.tokenizer.convert_ids_to_tokens(token)
        return self.memo[token]


def token_texts(name: str) -> TokenTexts:
    """This process's TokenTexts of the tokenizer ``name``; one of its own (the tokenizer read again) if it has none."""
    if (known := _TOKEN_TEXTS.get(name)) is not None:
        return known
    from transformers import AutoTokenizer

    return TokenTexts(AutoTokenizer.from_pretrained(name))


@dataclass(frozen=True)
class Loaded:
    speculative: Models
    plain: Models  # the same target without a drafter: the Race
    token_text: TokenTexts
    plain_step_s: float | None  # one plain decoding step, timed at load: the unit of the verdict's round cost
    ready: bool = True  # calibrated (``calibrated``): False after ``ModelCache.load`` alone

    @property
    def block_limit(self) -> int:
        """The largest block L the UI offers: the drafter's trained block size, if it has one, within the UI's cap."""
        return min(UI_MAX_BLOCK, self.speculative.drafter.max_block or UI_MAX_BLOCK)


@dataclass(frozen=True)
class DrafterMethod:
    """A method of the preset's drafter, by name: the process that receives it binds its own drafter's."""

    name: str


@dataclass(frozen=True)
class Calibration:
    """A preset's calibration (``ModelCache.calibration``) as plain data: the controller's stage costs by field, the
    plain step's time."""

    preset: str
    costs: dict | None
    plain_step_s: float | None


class ModelCache:
    """Loads each preset on first use and shares it read-only across requests (targets shared by presets). At most
    ``max_loaded`` presets stay loaded: loading another unloads the least recently used one (a request still running
    on it keeps its models until it ends)."""

    def __init__(self, config: AppConfig):
        self.presets = {p.name: p for p in config.presets}
        self.device, self.dtype, self.device_map = config.device, config.dtype, config.device_map
        self.access = config.access
        self.hardware = config.hardware or Hardware.detect(config.device, config.dtype)
        self.max_loaded = config.max_loaded
        self._targets: dict[str, tuple] = {}
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()  # least recently used first
        self._load_lock = threading.Lock()  # one load at a time: two first requests must not load a model twice
        self._index_lock = threading.Lock()  # guards _loaded's order; held briefly, never during a load
        self.in_flight = InFlight()  # the requests on these models now: a sweep reports the others beside it

    def preset(self, name: str) -> ModelPreset:
        if validation.text("model preset", name) not in self.presets:
            raise XpressError(f"unknown model preset {name!r}; choose one of: {', '.join(self.presets)}")
        return self.presets[name]

    def is_loaded(self, name: str) -> bool:
        return name in self._loaded

    def is_ready(self, name) -> bool:
        """Loaded and calibrated (any ``name``: a request's preset is checked later)."""
        return isinstance(name, str) and (loaded := self._loaded.get(name)) is not None and loaded.ready

    def describe(self, name: str) -> str:
        """A line about the preset for the UI, without loading it."""
        preset = self.preset(name)
        problem = preset_problem(preset, self.access, self.hardware)
        if problem:
            return f"⚠ {unavailable(preset, problem)}"
        hub = not (is_local(preset.target) and (preset.drafter == NO_DRAFTER or is_local(preset.drafter)))
        hub = hub and not preset.package  # a packaged target is installed, not downloaded
        where = "downloaded from the Hub and loaded on first use" if hub else "loaded on first use"
        needs = f" · needs: {preset.hardware}" if preset.hardware else ""
        line = f"target `{preset.target}` · drafter `{preset.drafter}` · {where}{needs}"
        with self._index_lock:
            loaded = self._loaded.get(name)
        if not loaded:
            return line
        costs = loaded.speculative.costs
        auto = f"\n\nAuto runs {costs.chosen.summary()}." if costs and costs.chosen else ""
        return f"{line}\n\n{dtype_note(loaded.speculative.dtype_choice)}{auto}"

    def load(self, name: str) -> Loaded:
        """The preset's models, loaded if they were not (downloads included), without running them: what the web
        process does on ZeroGPU, where only a GPU worker may run CUDA."""
        preset = self.preset(name)
        if (loaded := self._touch(name)) is not None:
            return loaded
        problem = preset_problem(preset, self.access, self.hardware)
        if problem:
            raise XpressError(unavailable(preset, problem))
        with self._load_lock:
            if (loaded := self._touch(name)) is not None:
                return loaded
            try:
                loaded = self._load(preset)
            except XpressError as error:
                raise XpressError(unavailable(preset, str(error))) from error
            self._keep(name, loaded)
        return loaded

    def get(self, name: str) -> Loaded:
        """The preset's models, loaded and calibrated: what a reply or a sweep decodes with."""
        loaded = self.load(name)
        if loaded.ready:
            return loaded
        with self._load_lock:
            loaded = self._touch(name) or loaded
            if not loaded.ready:
                loaded = calibrated(loaded.speculative, loaded.plain, loaded.token_text)
                self._keep(name, loaded)
        return loaded

    def calibration(self, name: str) -> Calibration | None:
        """What calibrating the preset measured, to send from a ZeroGPU worker to the web process; None if it has not
        been calibrated here. A method of the drafter goes as its name (it would pickle the drafter's weights)."""
        loaded = self._touch(name)
        if loaded is None or not loaded.ready:
            return None
        costs, drafter = loaded.speculative.costs, loaded.speculative.drafter
        portable = {}
        for field in fields(costs) if costs else ():
            value = getattr(costs, field.name)
            portable[field.name] = (
                DrafterMethod(value.__name__) if getattr(value, "__self__", None) is drafter else value
            )
        return Calibration(name, portable if costs else None, loaded.plain_step_s)

    def adopt(self, calibration: Calibration) -> None:
        """Keep what a GPU worker measured: the workers forked from now on start calibrated (a fresh worker would
        otherwise time the stages again, on the request's GPU time)."""
        with self._load_lock:
            loaded = self._touch(calibration.preset)
            if loaded is None or loaded.ready:
                return
            drafter = loaded.speculative.drafter
            costs = calibration.costs and CostModel(
                **{
                    k: getattr(drafter, v.name) if isinstance(v, DrafterMethod) else v
                    for k, v in calibration.costs.items()
                }
            )
            speculative = replace(loaded.speculative, costs=costs)
            self._keep(
                calibration.preset,
                replace(loaded, speculative=speculative, plain_step_s=calibration.plain_step_s, ready=True),
            )

    def _keep(self, name: str, loaded: Loaded) -> None:
        with self._index_lock:
            self._loaded[name] = loaded
            self._unload_least_recent()

    def _touch(self, name: str) -> Loaded | None:
        """The preset's models if loaded, marked as the most recently used."""
        with self._index_lock:
            if name not in self._loaded:
                return None
            self._loaded.move_to_end(name)
            return self._loaded[name]

    def _unload_least_recent(self) -> None:
        """Down to ``max_loaded`` presets, and only the targets they use (called holding both locks)."""
        while len(self._loaded) > self.max_loaded:
            self._loaded.popitem(last=False)
        used = {self.presets[name].target for name in self._loaded}
        for target in set(self._targets) - used:
            del self._targets[target]
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _load(self, preset: ModelPreset) -> Loaded:
        """The preset's models: a target another preset loaded already keeps its dtype; else ``auto`` on a CPU with
        native bf16 loads and times both dtypes and keeps the faster (``precision.py``)."""
        device = resolve_device(self.device)
        drafter = resolve_drafter(preset.drafter, DrafterOptions(kind=preset.drafter_kind), self.access)
        if preset.target in self._targets:
            target, tokenizer, choice = self._targets[preset.target]
            drafter_model = self._drafter(drafter, target, tokenizer, target.dtype)
            models = Models(target, tokenizer, drafter_model, dtype_choice=choice)
        else:
            target = resolve_model("target", preset.target, self.access)
            load = lambda name: self._fresh(target, drafter, device, resolve_dtype(name, device))
            if measures_dtype(self.dtype, device):
                choice, models = chosen_dtype(target, drafter, load)  # cached per machine and models
                models = replace(models or load(choice.dtype), dtype_choice=choice)
            else:
                dtype = resolve_dtype(self.dtype, device)
                models = replace(load(self.dtype), dtype_choice=unmeasured(self.dtype, dtype, device))
        self._targets[preset.target] = (models.target, models.tokenizer, models.dtype_choice)
        return Loaded(models, replace(models, drafter=NoDrafter()), TokenTexts(models.tokenizer), None, ready=False)

    def _fresh(self, target: ModelSpec, drafter: ModelSpec, device, dtype) -> Models:
        target_model, tokenizer = load_target(target, device, dtype, self.device_map, self.access)
        return Models(target_model, tokenizer, self._drafter(drafter, target_model, tokenizer, dtype))

    def _drafter(self, drafter: ModelSpec, target, tokenizer, dtype):
        return load_drafter(drafter, target, tokenizer, target.device, dtype, access=self.access)


def calibrated(speculative: Models, plain: Models, token_text: TokenTexts) -> Loaded:
    """The loaded models with the controller's stage costs measured and one plain decoding step timed (the verdict's
    unit), after building the kernels of the shapes replies meet (``warm_kernels``) and a short speculative run at
    the default settings: the first run pays one-off costs, here and not in a reply."""
    warm_kernels(speculative)  # no reply pays for a forward shape it meets first (packing.py)
    speculative = engine.calibrated(speculative)  # the controller auto's stage costs, measured once
    prompt = encode_prompt(plain.tokenizer, CALIBRATION_TEXT, chat=False)
    default = DEFAULTS.decode_config()
    block = min(default.block, speculative.drafter.max_block or default.block)
    decode_to_end(
        speculative,
        prompt,
        replace(default, block=block, steps=min(default.steps, block), max_new_tokens=CALIBRATION_TOKENS),
    )
    return Loaded(speculative, plain, token_text, calibrate_plain_step(plain, prompt))


def dtype_note(choice) -> str:
    """Which dtype the models run in and why (``models.DtypeChoice``)."""
    return f"Runs in {choice.dtype}: {choice.reason}." if choice else ""


# The cache this process serves from (``serve``): GPU functions take plain data and find the models here, in the web
# process as in a ZeroGPU worker, which inherits it when forked.
_SERVED: list[ModelCache] = []


def serve(cache: ModelCache) -> ModelCache:
    """Make ``cache`` the one this process's GPU functions decode with (``served``)."""
    _SERVED[:] = [cache]
    return cache


def served() -> ModelCache:
    if not _SERVED:
        raise XpressError("no model cache is being served in this process (xpress_app.models.serve)")
    return _SERVED[0]


def check_block(block: int, loaded: Loaded, preset: str) -> None:
    """Refuse a block L beyond what the preset's drafter was trained for, before any decoding starts."""
    if block > loaded.block_limit:
        raise XpressError(
            f"block L={block} is longer than the drafter of “{preset}” was trained for: choose L ≤ {loaded.block_limit}"
        )
