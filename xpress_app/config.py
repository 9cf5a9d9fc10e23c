"""The app's options (flags and their environment variables, so that a Hugging Face Space can set them) and the model
presets it offers."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

import torch

from xpress_core.errors import XpressError
from xpress_core.models import (
    EMBEDDED_AR_DRAFTER,
    EMBEDDED_DRAFTER,
    EMBEDDED_GAUSS_DRAFTER,
    EMBEDDED_TARGET,
    resolve_device,
    resolve_dtype,
)
from xpress_core.packing import packing_available
from xpress_core.precision import DTYPE_AUTO_HELP
from xpress_core.presets import ALLOW_UNKNOWN_ENV, TRUST_REMOTE_CODE_ENV, Access, ModelPreset, hub_presets

from .budget import DEFAULT_MEMORY_MB, DEFAULT_WALL_S, Budget

ENV = {
    "target": "XPRESS_TARGET",  # a custom preset's target: local directory or Hub id
    "drafter": "XPRESS_DRAFTER",  # its drafter: directory, Hub id or "none"
    "device": "XPRESS_DEVICE",
    "dtype": "XPRESS_DTYPE",
    "device_map": "XPRESS_DEVICE_MAP",  # "auto": spread the target over all GPUs (accelerate)
    "allow_unknown": ALLOW_UNKNOWN_ENV,  # load Hub ids no preset names
    "trust_remote_code": TRUST_REMOTE_CODE_ENV,  # allow model code from a model repository (presets that need it)
    "concurrency": "XPRESS_CONCURRENCY",  # requests decoded at the same time; more wait in the queue
    "presets": "XPRESS_PRESETS",  # the menu: all, embedded, or embedded plus Hub preset keys (comma list)
    "memory_gb": "XPRESS_MEMORY_GB",  # presets needing more memory are shown but refused
    "max_loaded": "XPRESS_MAX_LOADED",  # model pairs kept loaded; the least recently used one goes first
    "request_s": "XPRESS_REQUEST_S",  # a request's wall-time budget (a sweep's whole grid included)
    "request_mb": "XPRESS_REQUEST_MB",  # the server memory a request may grow it by
}
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 7860  # Gradio's GRADIO_SERVER_NAME / GRADIO_SERVER_PORT set others
DEFAULT_CONCURRENCY = 2
QUEUE_SIZE = 64
DEFAULT_MAX_LOADED = 2
ALL_PRESETS, EMBEDDED_ONLY = "all", "embedded"
MAX_UPLOAD = "64kb"  # the app takes no file; Gradio's upload route stays open, so keep what it accepts small

EMBEDDED_PRESET = "Embedded · diffusion drafter"
EMBEDDED_GAUSS_PRESET = "Embedded · gaussian diffusion drafter"
EMBEDDED_AR_PRESET = "Embedded · autoregressive drafter"
CUSTOM_PRESET = "Custom (--target / --drafter)"


@dataclass(frozen=True)
class Hardware:
    """What this server can run: presets that need more are shown but refused (a public Space stays safe)."""

    cuda: bool
    memory_gb: float  # the budget for one preset's weights
    # The weights take twice the bf16 size the presets state: loaded in fp32, or in bf16 on a CPU, where loading keeps
    # a packed copy of every linear layer (xpress_core/packing.py).
    doubled: bool = False

    @classmethod
    def detect(cls, device: str, dtype: str = "auto", memory_gb: float | None = None) -> Hardware:
        """CUDA when the device resolves to it; the budget: ``memory_gb``, else the GPU's memory, else half the RAM."""
        resolved = resolve_device(device)
        cuda = resolved.type == "cuda"
        if memory_gb is None:
            if cuda:
                memory_gb = torch.cuda.get_device_properties(0).total_memory / 2**30
            else:
                memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 / 2
        weights = resolve_dtype(dtype, resolved)
        return cls(cuda, memory_gb, weights == torch.float32 or packing_available(weights, resolved))


@dataclass(frozen=True)
class AppConfig:
    presets: tuple[ModelPreset, ...]  # the first one is selected at start
    device: str = "auto"
    dtype: str = "auto"
    concurrency: int = DEFAULT_CONCURRENCY
    device_map: str | None = None
    access: Access = field(default_factory=Access)
    hardware: Hardware | None = None  # None: detected from the device and the machine
    max_loaded: int = DEFAULT_MAX_LOADED
    budget: Budget = field(default_factory=Budget)
    host: str = DEFAULT_HOST  # what the server listens on (Gradio's server_name and server_port)
    port: int = DEFAULT_PORT


def default_presets(
    target: str | None = None, drafter: str | None = None, menu: str = ALL_PRESETS
) -> tuple[ModelPreset, ...]:
    """The presets whose target an installed package ships, then the embedded ones, then the Hub presets (downloaded
    on first use) that ``menu`` allows; a custom one first when a target or drafter was given. ``menu``: all, embedded, or "embedded,KEY,..." with Hub preset keys."""
    embedded = (
        ModelPreset(EMBEDDED_PRESET, str(EMBEDDED_TARGET), str(EMBEDDED_DRAFTER)),
        ModelPreset(EMBEDDED_GAUSS_PRESET, str(EMBEDDED_TARGET), str(EMBEDDED_GAUSS_DRAFTER)),
        ModelPreset(EMBEDDED_AR_PRESET, str(EMBEDDED_TARGET), str(EMBEDDED_AR_DRAFTER)),
    )
    offered = menu_presets(menu)
    # A real model installed here (SmolLM2's wheel) is the one a newcomer meets first; the embedded pair starts instantly
    # and stays first otherwise.
    local = tuple(p for p in offered if p.package and p.installed())
    presets = local + embedded + tuple(p for p in offered if p not in local)
    if target is None and drafter is None:
        return presets
    custom = ModelPreset(CUSTOM_PRESET, target or str(EMBEDDED_TARGET), drafter or str(EMBEDDED_DRAFTER))
    return (custom,) + presets


def menu_presets(menu: str) -> tuple[ModelPreset, ...]:
    """The Hub presets the menu setting names (the embedded ones are always offered)."""
    if menu.strip() == ALL_PRESETS:
        return hub_presets()
    keys = {key.strip() for key in menu.split(",")} - {EMBEDDED_ONLY, ""}
    known = {p.key for p in hub_presets()}
    if keys - known:
        raise XpressError(
            f"{ENV['presets']}: unknown preset(s) {', '.join(sorted(keys - known))}; write {ALL_PRESETS}, "
            f"{EMBEDDED_ONLY}, or {EMBEDDED_ONLY} and keys of: {', '.join(sorted(known))}"
        )
    return tuple(p for p in hub_presets() if p.key in keys)


def parse_args(argv: list[str] | None = None) -> AppConfig:
    env = os.environ
    parser = argparse.ArgumentParser(description="xPress: the speculative decoding app (Gradio).")
    add_model_args(parser, env)
    add_capacity_args(parser, env)
    add_budget_args(parser, env)
    add_server_args(parser, env)
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.max_loaded < 1:
        parser.error("--concurrency and --max-loaded must be at least 1")
    if not (args.request_seconds > 0 and args.request_memory_mb > 0):
        parser.error("--request-seconds and --request-memory-mb must be positive")
    if not 0 < args.port < 65536:
        parser.error(f"--port must be from 1 to 65535, got {args.port}")
    try:
        presets = default_presets(args.target, args.drafter, args.presets)
        hardware = Hardware.detect(args.device, args.dtype, args.memory_gb)
    except XpressError as error:
        parser.error(str(error))
    access = Access.from_env(args.allow_unknown_models, args.trust_remote_code)
    budget = Budget(args.request_seconds, args.request_memory_mb)
    return AppConfig(
        presets,
        args.device,
        args.dtype,
        args.concurrency,
        args.device_map,
        access,
        hardware,
        args.max_loaded,
        budget,
        args.host,
        args.port,
    )


def add_model_args(parser: argparse.ArgumentParser, env) -> None:
    """Which models, where and how: a custom preset, the device, dtype and device map, and the two opt-ins."""
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
        help=f"{DTYPE_AUTO_HELP}, float32, bfloat16 (env {ENV['dtype']})",
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


def add_capacity_args(parser: argparse.ArgumentParser, env) -> None:
    """How much the server takes on: concurrent requests, the model menu, memory and the pairs kept loaded."""
    parser.add_argument(
        "--concurrency",
        type=int,
        default=env.get(ENV["concurrency"], str(DEFAULT_CONCURRENCY)),
        help=f"requests decoded at the same time (env {ENV['concurrency']})",
    )
    parser.add_argument(
        "--presets",
        default=env.get(ENV["presets"], ALL_PRESETS),
        help=f"the model menu: {ALL_PRESETS}, {EMBEDDED_ONLY}, or {EMBEDDED_ONLY},KEY,... (env {ENV['presets']})",
    )
    parser.add_argument(
        "--memory-gb",
        type=float,
        default=env.get(ENV["memory_gb"]),  # argparse applies `type` to a string default: a bad value is an error
        help=f"memory for one preset's weights; larger ones are refused [GPU memory, or half the RAM] "
        f"(env {ENV['memory_gb']})",
    )
    parser.add_argument(
        "--max-loaded",
        type=int,
        default=env.get(ENV["max_loaded"], str(DEFAULT_MAX_LOADED)),
        help=f"model pairs kept loaded; the least recently used is unloaded (env {ENV['max_loaded']})",
    )


def add_server_args(parser: argparse.ArgumentParser, env) -> None:
    """Where the page is served. Gradio's own variables are the defaults, so a Space or a launcher that sets them
    keeps working."""
    parser.add_argument(
        "--host",
        default=env.get("GRADIO_SERVER_NAME", DEFAULT_HOST),
        help="address to listen on; 0.0.0.0 for every interface (env GRADIO_SERVER_NAME)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=env.get("GRADIO_SERVER_PORT", str(DEFAULT_PORT)),
        help="port to serve on (env GRADIO_SERVER_PORT)",
    )


def add_budget_args(parser: argparse.ArgumentParser, env) -> None:
    parser.add_argument(
        "--request-seconds",
        type=float,
        default=env.get(ENV["request_s"], str(DEFAULT_WALL_S)),
        help=f"wall time a request may take, a sweep's whole grid included; checked between rounds (env {ENV['request_s']})",
    )
    parser.add_argument(
        "--request-memory-mb",
        type=float,
        default=env.get(ENV["request_mb"], str(DEFAULT_MEMORY_MB)),
        help=f"how much a request may grow the server's memory, checked between rounds (env {ENV['request_mb']})",
    )
