"""``python -m xpress_core bench``: the command line, its sizes (full and ``--quick``), loading the models, the run."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .. import validation
from ..data import PROMPT_SETS, QUICK_PROMPTS, SPLITS, Prompt, evaluation_prompts, read_prompt_file, split_of, spread
from ..engine import calibrate
from ..errors import XpressError
from ..models import (
    EMBEDDED_AR_DRAFTER,
    EMBEDDED_DRAFTER,
    EMBEDDED_GAUSS_DRAFTER,
    EMBEDDED_TARGET,
    WARM_ROWS,
    DtypeChoice,
    Models,
    check_tokenizer_match,
    context_limit,
    eos_ids,
    load_causal_lm,
    load_drafter,
    load_target,
    measures_dtype,
    resolve_device,
    resolve_drafter,
    resolve_dtype,
    resolve_model,
    unmeasured,
)
from ..packing import warm_packed
from ..precision import DTYPE_AUTO_HELP, chosen_dtype
from ..presets import Access, find_preset
from .grid import FULL_GRID, QUICK_GRID, parse_grid
from .measure import RunPlan
from .methods import (
    ASSISTED_TOKENS,
    ASSISTED_TOKENS_QUICK,
    DRAFTING,
    HF_ASSISTED,
    LOOKUP_TOKENS,
    LOOKUP_TOKENS_QUICK,
    METHODS,
    XPRESS_AUTO,
    BenchModels,
    Setting,
    method_settings,
)
from .report import markdown_table, write_outputs
from .stages import FINAL_STAGE, FINALISTS, SEARCH_PROMPTS, SEARCH_STAGE, choose_finalists, run_stage

SAMPLING_TEMPERATURE = 0.7


TEMPERATURES = (0.0, SAMPLING_TEMPERATURE)


@dataclass(frozen=True)
class BenchPreset:
    """A benchmark size: the full run or ``--quick``."""

    grid: str
    assisted_tokens: tuple[int | None, ...]
    lookup_tokens: tuple[int | None, ...]
    max_new_tokens: int
    repeats: int
    prompt_sets: tuple[str, ...]  # shipped in xpress_core/prompts/ (``data.evaluation_prompts``)
    search_prompts: int


FULL = BenchPreset(
    FULL_GRID, ASSISTED_TOKENS, LOOKUP_TOKENS, 128, 3, ("sgd_dev", "sgd_short", "stories"), SEARCH_PROMPTS
)


QUICK = BenchPreset(QUICK_GRID, ASSISTED_TOKENS_QUICK, LOOKUP_TOKENS_QUICK, 64, 1, ("quick",), 0)


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="measure tokens/s against transformers generate, assisted, prompt lookup")
    bench.add_argument("--preset", help="a preset by key (list: `presets`); --target/--drafter override its parts")
    bench.add_argument("--target", help=f"target: local dir or Hub id [{EMBEDDED_TARGET.name}, or the preset's]")
    bench.add_argument(
        "--drafter",
        help=f"diffusion drafter for the xpress method (masked; the gaussian one: {EMBEDDED_GAUSS_DRAFTER}) "
        "[the embedded one, or the preset's]",
    )
    bench.add_argument("--ar-drafter", help="assistant model for hf-assisted [the embedded one, or the preset's]")
    bench.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    bench.add_argument(
        "--threads",
        type=int,
        default=torch.get_num_threads(),
        help="CPU threads every method runs with (default: this process's, which the app and the CLI also use: "
        f"{torch.get_num_threads()} here)",
    )
    bench.add_argument("--dtype", default="auto", help=f"{DTYPE_AUTO_HELP}, float32, bfloat16")
    bench.add_argument(
        "--generate-dtypes",
        default="auto",
        help="hf-generate runs again in these dtypes, comma list (auto: on a CPU float32 or bfloat16, whichever the run "
        "is not, on CUDA none; none: only the run's), so that no speedup comes from a baseline held to its slower dtype",
    )
    bench.add_argument("--prompts", type=Path, help='JSONL: {"messages": [...]} or {"prompt": "..."} a line')
    bench.add_argument(
        "--data",
        type=Path,
        help="derive the default prompt sets from this data folder instead of the shipped ones (xpress_core/prompts/)",
    )
    bench.add_argument(
        "--sets",
        help=f"comma list of the shipped prompt sets to measure (default: {','.join(FULL.prompt_sets)}; any of "
        f"{', '.join(PROMPT_SETS)})",
    )
    bench.add_argument(
        "--split",
        choices=("all", *SPLITS),
        default="all",
        help="measure one half of the prompts: tune (what constants are chosen on) or held (reported only; "
        "data.split_of, fixed by each prompt's content)",
    )
    bench.add_argument(
        "--num-prompts", type=int, help="use only the first N prompts (the defaults: chats, short chats, then stories)"
    )
    bench.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    bench.add_argument(
        "--grid", help=f'xpress settings, e.g. "K=1,4 T=1,2 L=8; K=4 T=2 L=8 refine=serial" (default: {FULL_GRID})'
    )
    bench.add_argument("--assisted-tokens", help="hf-assisted draft lengths, comma list; 'default' = HF's schedule")
    bench.add_argument("--lookup-tokens", help="hf-prompt-lookup candidate lengths, comma list")
    bench.add_argument("--temperatures", help="comma list (default 0,0.7)")
    bench.add_argument(
        "--max-new-tokens", type=int, help=f"default {FULL.max_new_tokens} ({QUICK.max_new_tokens} with --quick)"
    )
    bench.add_argument(
        "--repeats",
        type=int,
        help=f"final-stage passes over the prompts (default {FULL.repeats}, {QUICK.repeats} with --quick)",
    )
    bench.add_argument("--warmup", type=int, default=1, help="untimed calls per setting before measuring")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument(
        "--search-prompts",
        type=int,
        help=f"prompts of the search stage (default {SEARCH_PROMPTS}; 0 = no search: every setting in the final stage)",
    )
    bench.add_argument("--finalists", type=int, default=FINALISTS, help="xPress settings the final stage measures")
    bench.add_argument(
        "--quick",
        action="store_true",
        help=f"{sum(QUICK_PROMPTS)} prompts, grid {QUICK_GRID!r}, 1 repeat, no search: under 3 minutes on 2 CPU cores",
    )
    bench.add_argument(
        "--json",
        type=Path,
        default=Path("runs") / "bench" / "bench.json",
        help="results JSON; the CSV, table and HTML figures go beside it",
    )
    bench.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _int_list(raw: str, flag: str) -> tuple[int | None, ...]:
    try:
        return tuple(None if v == "default" else int(v) for v in raw.split(","))
    except ValueError as error:
        raise XpressError(f"{flag}: expected a comma list of integers, got {raw!r}") from error


def _float_list(raw: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in raw.split(","))
    except ValueError as error:
        raise XpressError(f"{flag}: expected a comma list of numbers, got {raw!r}") from error


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def generate_dtypes(raw: str, run_dtype: str, device) -> tuple[str, ...]:
    """The dtypes ``generate`` runs in besides the run's (``--generate-dtypes``), by canonical name. ``auto``: on a
    CPU the other of float32 and bfloat16 (which is faster for one-token forwards depends on the CPU: fp32 on ours);
    on CUDA none (fp32 is the slower there, and a second copy of a large target may not fit)."""
    if raw == "none" or (raw == "auto" and device.type == "cuda"):
        return ()
    if raw == "auto":
        return tuple(d for d in ("float32", "bfloat16") if d != run_dtype)
    names = (dtype_name(resolve_dtype(d.strip(), device)) for d in raw.split(",") if d.strip())
    return tuple(dict.fromkeys(d for d in names if d != run_dtype))


def bench_dtype(args: argparse.Namespace, device: torch.device) -> DtypeChoice:
    """The dtype the run measures in: ``--dtype``, or with ``auto`` on a CPU with native bf16 the one the app would
    choose (``precision.chosen_dtype``: the choice cached for these models at ``--threads``, else target and drafter
    timed in both), so that the benchmark measures what users run."""
    if not measures_dtype(args.dtype, device):
        return unmeasured(args.dtype, resolve_dtype(args.dtype, device), device)

    access = Access.from_env()
    target_spec, drafter_spec = (
        resolve_model("target", args.target, access),
        resolve_drafter(args.drafter, access=access),
    )

    def load(name: str) -> Models:
        dtype = resolve_dtype(name, device)
        target, tokenizer = load_target(target_spec, device, dtype)
        return Models(target, tokenizer, load_drafter(drafter_spec, target, tokenizer, device, dtype))

    return chosen_dtype(target_spec, drafter_spec, load)[0]


def load_bench_models(args: argparse.Namespace, settings: Sequence[Setting], choice: DtypeChoice) -> BenchModels:
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    methods = {s.method for s in settings}
    target_spec = resolve_model("target", args.target, Access.from_env())  # read once, loaded in every dtype asked
    target, tokenizer = load_target(target_spec, device, dtype)
    others = {s.dtype: load_target(target_spec, device, resolve_dtype(s.dtype, device))[0] for s in settings if s.dtype}
    drafting = any(m in methods for m in DRAFTING)
    drafter = load_drafter(args.drafter, target, tokenizer, device, dtype) if drafting else None
    assistant = None
    if HF_ASSISTED in methods:
        check_tokenizer_match("AR drafter", args.ar_drafter, tokenizer)
        assistant = load_causal_lm("AR drafter", args.ar_drafter, device, dtype)
        if assistant.config.vocab_size != target.config.vocab_size:
            raise XpressError(
                f"AR drafter {args.ar_drafter!r} has vocabulary size {assistant.config.vocab_size}, "
                f"the target {target.config.vocab_size}"
            )
        # transformers stops the assistant where the target stops; give it the target's end tokens.
        assistant.generation_config.eos_token_id = sorted(eos_ids(target, tokenizer))
    # As the app does at load: no method pays for a forward shape it meets first (packing.py), every method alike.
    drafter_model = getattr(drafter, "model", None)
    warm_packed([m for m in (target, *others.values(), drafter_model, assistant) if m is not None], WARM_ROWS)
    costs = calibrate(Models(target, tokenizer, drafter)) if XPRESS_AUTO in methods else None
    return BenchModels(target, tokenizer, drafter, assistant, costs=costs, targets=others, dtype_choice=choice)


def check_run_args(args: argparse.Namespace, temperatures: Sequence[float]) -> None:
    """The shared checks (``validation``) before any model loads or any measurement runs: a bad seed, temperature or
    device, or an output that cannot be written, must not surface after an hour of measuring."""
    validation.seed(args.seed)
    for t in temperatures:
        validation.temperature(t, validation.ENGINE_LIMITS.max_temperature)
    validation.device(args.device)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    validation.output_file("--json", args.json)


def bench_prompts(args: argparse.Namespace, preset: BenchPreset) -> tuple[Prompt, ...]:
    """The prompts to measure: a file's, or the named shipped sets (the preset's by default); one half of them with
    ``--split``; the first ``--num-prompts``."""
    if args.prompts and args.sets:
        raise XpressError("--prompts and --sets name two sources of prompts: give one")
    sets = tuple(s.strip() for s in args.sets.split(",") if s.strip()) if args.sets else preset.prompt_sets
    unknown = sorted(set(sets) - set(PROMPT_SETS))
    if unknown:
        raise XpressError(f"unknown prompt set {unknown[0]!r}: the shipped ones are {', '.join(PROMPT_SETS)}")
    prompts = read_prompt_file(args.prompts) if args.prompts else evaluation_prompts(sets, args.data)
    if args.split != "all":
        prompts = tuple(p for p in prompts if split_of(p) == args.split)
        if not prompts:
            raise XpressError(f"no prompt of these falls in the {args.split} half")
    return prompts[: args.num_prompts] if args.num_prompts else prompts


def bench_models_from_preset(args: argparse.Namespace) -> None:
    """--target, --drafter and --ar-drafter as given, else the --preset's, else the embedded models."""
    chosen = find_preset(args.preset) if args.preset else None
    args.target = args.target or (chosen.target if chosen else str(EMBEDDED_TARGET))
    args.drafter = args.drafter or (chosen.drafter if chosen else str(EMBEDDED_DRAFTER))
    args.ar_drafter = args.ar_drafter or (
        chosen.ar_drafter if chosen and chosen.ar_drafter else str(EMBEDDED_AR_DRAFTER)
    )


def run_bench(args: argparse.Namespace) -> int:
    bench_models_from_preset(args)
    preset = QUICK if args.quick else FULL
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    grid = parse_grid(args.grid or preset.grid)
    assisted = _int_list(args.assisted_tokens, "--assisted-tokens") if args.assisted_tokens else preset.assisted_tokens
    lookup = _int_list(args.lookup_tokens, "--lookup-tokens") if args.lookup_tokens else preset.lookup_tokens
    temperatures = _float_list(args.temperatures, "--temperatures") if args.temperatures else TEMPERATURES
    search_prompts = preset.search_prompts if args.search_prompts is None else args.search_prompts
    repeats, max_new_tokens = args.repeats or preset.repeats, args.max_new_tokens or preset.max_new_tokens
    if min(repeats, max_new_tokens, args.num_prompts or 1, args.finalists, args.threads) < 1:
        raise XpressError("--repeats, --max-new-tokens, --num-prompts, --finalists and --threads must be >= 1")
    if min(args.warmup, search_prompts) < 0:
        raise XpressError("--warmup and --search-prompts must be >= 0")
    check_run_args(args, temperatures)
    prompts = bench_prompts(args, preset)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    resolve_dtype(args.dtype, device)  # an unknown --dtype fails before the models load
    choice = bench_dtype(args, device)
    args.dtype = choice.dtype
    settings = method_settings(
        methods, grid, assisted, lookup, generate_dtypes(args.generate_dtypes, choice.dtype, device)
    )
    plan = RunPlan(settings, temperatures, max_new_tokens, repeats, args.warmup, args.seed)
    models = load_bench_models(args, settings, choice)
    if models.costs and models.costs.chosen:  # what xpress-auto will run, before an hour of measuring
        print(f"note: xpress-auto runs {models.costs.chosen.summary()}", file=sys.stderr)
    for prompt in prompts:  # measured as fitted; say which were cut
        notice = prompt.fitted(models.tokenizer, context_limit(models.target), plan.max_new_tokens).notice
        if notice:
            print(f"note: prompt {prompt.name}: {notice}", file=sys.stderr)

    stages = []
    if search_prompts and len(grid) > args.finalists:
        search_plan = replace(plan, temperatures=(0.0,), repeats=1)
        stages.append(run_stage(SEARCH_STAGE, models, spread(prompts, search_prompts), search_plan, args.no_progress))
        plan = replace(plan, settings=choose_finalists(stages[0].run.summaries, args.finalists))
    stages.append(run_stage(FINAL_STAGE, models, prompts, plan, args.no_progress))
    files = write_outputs(stages, args, models)
    print(markdown_table(stages[-1].run.summaries, stages[-1].run.measurements))
    print(
        json.dumps(
            {
                "mismatches": sum(len(st.run.mismatches) for st in stages),
                "skipped": sum(len(st.run.skipped) for st in stages),
                "files": files,
            },
            indent=2,
        )
    )
    return 0
