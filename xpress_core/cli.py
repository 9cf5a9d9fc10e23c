"""``python -m xpress_core``: generate, presets, init-drafter, train (and bench).

Every user error becomes one line on stderr and exit code 2; a traceback means a bug.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from . import validation
from .bench.cli import add_bench_parser, run_bench
from .config import DIVERSITY, NOISE_TYPES, REFINE_MODES, SAMPLED_DRAFTS, SCHEDULES, VERIFY_MODES, DecodeConfig
from .errors import XpressError
from .precision import DTYPE_AUTO_HELP
from .train.cli import add_train_parser, run_train


def add_model_args(parser: argparse.ArgumentParser) -> None:
    from .models import DRAFTER_KINDS
    from .presets import ALLOW_UNKNOWN_ENV, TRUST_REMOTE_CODE_ENV

    parser.add_argument("--preset", help="a Hub preset by key (list: `presets`); --target/--drafter override its parts")
    parser.add_argument("--target", help="target: local directory or Hub id [assets/target]")
    parser.add_argument("--drafter", help="drafter directory or Hub id, or 'none' [assets/drafter]")
    parser.add_argument("--drafter-kind", choices=DRAFTER_KINDS, help="how to load the drafter [auto: from its config]")
    parser.add_argument(
        "--logit-shift",
        action=argparse.BooleanOptionalAction,
        help="diffusion-LM drafter: logits at position i predict token i+1 [the family's convention: Dream yes]",
    )
    parser.add_argument("--mask-token-id", type=int, help="diffusion-LM drafter: its mask token id [its own]")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument(
        "--dtype",
        default="auto",
        help=f"{DTYPE_AUTO_HELP}, float32 (token-for-token exact), bfloat16",
    )
    parser.add_argument("--device-map", help="'auto': spread the target over all GPUs (accelerate), for big targets")
    parser.add_argument(
        "--allow-unknown-models", action="store_true", help=f"load Hub ids no preset names (env {ALLOW_UNKNOWN_ENV})"
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help=f"allow model code from a model's repository, for presets that need it (env {TRUST_REMOTE_CODE_ENV})",
    )


def model_choice(args: argparse.Namespace) -> dict:
    """``load_models`` arguments from --preset, --target/--drafter and the drafter and access options."""
    from .models import EMBEDDED_DRAFTER, EMBEDDED_TARGET, DrafterOptions
    from .presets import Access, find_preset

    preset = find_preset(args.preset) if args.preset else None
    kind = args.drafter_kind or (preset.drafter_kind if preset and not args.drafter else "auto")
    return {
        "target": args.target or (preset.target if preset else str(EMBEDDED_TARGET)),
        "drafter": args.drafter or (preset.drafter if preset else str(EMBEDDED_DRAFTER)),
        "device": args.device,
        "dtype": args.dtype,
        "device_map": args.device_map,
        "drafter_options": DrafterOptions(kind, args.logit_shift, args.mask_token_id),
        "access": Access.from_env(args.allow_unknown_models, args.trust_remote_code),
    }


class Parser(argparse.ArgumentParser):
    """Usage mistakes end like every other user error: one ``error:`` line, exit code 2 (argparse would print its
    usage first). Subcommand parsers inherit the class."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def add_decode_args(parser: argparse.ArgumentParser) -> None:
    d = DecodeConfig()
    pin = "; pins the setting (unset ones take their defaults) [unset: auto, the (K, T, L) chosen at load]"
    parser.add_argument("--drafts", "-K", type=int, help=f"K drafts refined together [{d.drafts}]{pin}")
    parser.add_argument("--steps", "-T", type=int, help=f"T denoise steps per round (1..L) [{d.steps}]{pin}")
    parser.add_argument("--block", "-L", type=int, help=f"L tokens per draft [{d.block}]{pin}")
    parser.add_argument("--temperature", type=float, default=d.temperature, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=d.top_p)
    parser.add_argument("--top-k", type=int, default=d.top_k, help="0 = off")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    parser.add_argument("--refine", choices=REFINE_MODES, default=d.refine)
    parser.add_argument("--verify", choices=VERIFY_MODES, default=d.verify)
    parser.add_argument("--schedule", choices=SCHEDULES, default=d.schedule)
    parser.add_argument("--diversity", choices=DIVERSITY, default=d.diversity)
    parser.add_argument(
        "--sampled-drafts",
        choices=SAMPLED_DRAFTS,
        default=d.sampled_drafts,
        help="when sampling: draft the token coupled to the target's coming draw, or the drafter's most likely one",
    )
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


# the settings every run takes (-K/-T/-L only when given)
DECODE_SETTINGS = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_new_tokens",
    "refine",
    "verify",
    "schedule",
    "diversity",
    "sampled_drafts",
    "stop",
)


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    """-K/-T/-L pin the setting (the unset ones take DecodeConfig's defaults); none of them: ``auto``."""
    pinned = {name: getattr(args, name) for name in ("drafts", "steps", "block") if getattr(args, name) is not None}
    settings = {name: getattr(args, name) for name in DECODE_SETTINGS}
    return validation.decode_config(settings | pinned | {"auto": not pinned})


def check_generate_args(args: argparse.Namespace) -> DecodeConfig:
    """Every setting of ``generate`` checked before any model work: a mistake costs no load and no decode."""
    import torch

    from .models import resolve_dtype

    cfg = decode_config(args)
    validation.text("the prompt", args.prompt)
    for name in ("target", "drafter", "preset"):
        if getattr(args, name) is not None:
            validation.model_spec(f"--{name}", getattr(args, name))
    validation.device(args.device)
    resolve_dtype(args.dtype, torch.device("cpu"))
    if args.log is not None:
        validation.output_file("--log", args.log)
    return cfg


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m xpress_core", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode one prompt with speculative decoding")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action="store_true", help="apply the target's chat template")
    add_model_args(gen)
    add_decode_args(gen)
    gen.add_argument("--log", type=Path, help="write the per-round JSONL log here")
    gen.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")

    sub.add_parser("presets", help="list the Hub presets (one JSON object a line)")

    init = sub.add_parser("init-drafter", help="write an untrained diffusion drafter for any HF causal-LM target")
    init.add_argument("--target", required=True)
    init.add_argument("--out", type=Path, required=True)
    init.add_argument("--layers", type=int, default=1)
    init.add_argument("--block", type=int, default=16)
    init.add_argument("--noise", choices=NOISE_TYPES, default="mask", help="the drafter's noise type")
    init.add_argument(
        "--format", choices=("xpress", "dflash"), default="xpress", help="dflash: written in the DFlash format"
    )

    export = sub.add_parser("export-dflash", help="write a drafter of ours in the DFlash format (serving engines)")
    export.add_argument("--drafter", required=True, help="an xPress drafter directory (DFlash layout)")
    export.add_argument("--out", type=Path, required=True)

    add_train_parser(sub)
    add_bench_parser(sub)
    return parser


def run_generate(args: argparse.Namespace) -> int:
    from .chat import fit_prompt
    from .engine import calibrated, decode
    from .models import context_limit
    from .precision import load_fastest
    from .records import json_record
    from .trace import DecodeResult, RoundTrace, write_jsonl
    from .verdict import against_fastest_plain, refinement_gain, refinement_line

    cfg = check_generate_args(args)
    models = load_fastest(**model_choice(args))
    if cfg.auto:  # calibrated here rather than in decode: the choice it makes is reported below
        models = calibrated(models)
    prompt = fit_prompt(models.tokenizer, args.prompt, args.chat, context_limit(models.target), cfg.max_new_tokens)
    if prompt.notice:
        print(f"note: {prompt.notice}", file=sys.stderr)
    prompt_ids = prompt.ids
    traces: list[RoundTrace] = []
    result: DecodeResult | None = None
    printed = ""
    for event in decode(models, prompt_ids, cfg):
        if isinstance(event, DecodeResult):
            result = event
        else:
            traces.append(event)
            if not args.json:  # stream the text as rounds land
                text = models.tokenizer.decode([t for tr in traces for t in tr.emitted], skip_special_tokens=True)
                sys.stdout.write(text[len(printed) :])
                sys.stdout.flush()
                printed = text
    if args.log:
        try:
            write_jsonl(traces, args.log)
        except OSError as error:  # checked writable before decoding, yet a disk can fill up meanwhile
            raise XpressError(f"--log {str(args.log)!r} could not be written: {error.strerror or error}") from None
    gain = refinement_gain(traces)
    auto_choice = models.costs.chosen if cfg.auto and models.costs else None
    if args.json:
        refinement = None if gain is None else json_record(asdict(gain))
        choice = models.dtype_choice
        plain = against_fastest_plain(traces, choice)  # every speedup over the fastest plain decoding here
        extra = {"dtype_choice": choice.to_json(), "refinement": refinement, "over_fastest_plain": plain}
        extra["auto_choice"] = auto_choice.to_json() if auto_choice else None
        print(json.dumps(result.to_json() | extra))
    else:
        print(
            f"\n[{result.new_tokens} tokens, {result.rounds} rounds, tau {result.tau:.2f}, "
            f"{result.tokens_per_s:.1f} tok/s, stop: {result.stop_reason}, "
            f"{'auto: ' + str(sum(s[2] == 0 for s in result.settings)) + ' plain steps' if cfg.auto else 'fixed'}, "
            f"{result.dtype}: {models.dtype_choice.reason}]",
            file=sys.stderr,
        )
        if gain is not None:
            print(f"[{refinement_line(gain)}]", file=sys.stderr)
        if auto_choice:
            print(f"[auto runs {auto_choice.summary()}]", file=sys.stderr)
    return 0


def run_presets(args: argparse.Namespace) -> int:
    from .needs import MODEL_EXTRAS
    from .presets import hub_presets

    for preset in hub_presets():
        extras = [pip for name in (preset.target, preset.drafter) for pip in MODEL_EXTRAS.get(name, {}).values()]
        print(json.dumps(asdict(preset) | {"extras": extras}))
    return 0


def run_init_drafter(args: argparse.Namespace) -> int:
    from .models import export_dflash, init_drafter

    if args.layers < 1 or args.block < 1:
        raise XpressError("--layers and --block must be >= 1")
    dflash = args.format == "dflash"
    model = init_drafter(
        args.target, args.out, layers=args.layers, block=args.block, noise=args.noise, dflash_layout=dflash
    )
    if dflash:
        export_dflash(args.out, args.out)
    print(
        json.dumps(
            {
                "out": str(args.out),
                "parameters": sum(p.numel() for p in model.parameters()),
                "tapped_layers": model.config.tapped_layers,
                "block_size": model.config.block_size,
                "noise": model.config.noise,
            }
        )
    )
    return 0


def run_export_dflash(args: argparse.Namespace) -> int:
    from .models import export_dflash

    config = export_dflash(args.drafter, args.out)
    print(json.dumps({"out": str(args.out), "architectures": config["architectures"], **config["dflash_config"]}))
    return 0


COMMANDS = {
    "generate": run_generate,
    "presets": run_presets,
    "init-drafter": run_init_drafter,
    "export-dflash": run_export_dflash,
    "train": run_train,
    "bench": run_bench,
}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars would drown the output
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except XpressError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
