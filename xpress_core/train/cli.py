"""``python -m xpress_core train STEP``: each step resumable, each writing a Hugging Face format directory."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ..config import NOISE_TYPES
from ..data import DEFAULT_DATA
from ..errors import XpressError
from .draft_vocab import add_draft_vocab_step, run_draft_vocab_step
from .refiner_cli import (
    add_device_arg,
    add_large_target_args,
    add_refiner_step,
    add_target_dtype_arg,
    check_cached_features,
    run_refiner_step,
    target_dtype,
)

DEFAULT_WORK = Path("runs")
# ``train compare``'s settings: one draft and the K = 4 tree, at every T the card measures
COMPARE_SETTINGS = ("1,1,8", "1,2,8", "1,3,8", "1,4,8", "4,1,8", "4,2,8", "4,3,8")


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train the embedded models (or a drafter for your own target)")
    steps = train.add_subparsers(dest="step", required=True)
    add_target_steps(steps)
    add_drafter_steps(steps)
    add_refiner_step(steps)
    add_draft_vocab_step(steps)
    add_report_steps(steps)


def add_target_steps(steps: argparse._SubParsersAction) -> None:
    """tokenizer, corpus, target: the embedded target from the shared data."""
    tok = steps.add_parser("tokenizer", help="byte-level BPE with chat special tokens")
    tok.add_argument("--data", type=Path, default=DEFAULT_DATA)
    tok.add_argument("--vocab-size", type=int, default=4096)
    tok.add_argument("--out", type=Path, default=DEFAULT_WORK / "tokenizer")

    corpus = steps.add_parser("corpus", help="tokenize the data folder (../shared/data) into train.bin / val.bin")
    corpus.add_argument("--data", type=Path, default=DEFAULT_DATA)
    corpus.add_argument(
        "--tokenizer",
        type=Path,
        default=DEFAULT_WORK / "tokenizer",
        help="a tokenizer folder, or a target's (a GGUF spec too): another family's corpus is rendered by its template",
    )
    corpus.add_argument("--out", type=Path, default=DEFAULT_WORK / "corpus")

    target = steps.add_parser("target", help="the Llama chat target")
    target.add_argument("--tokenizer", type=Path, default=DEFAULT_WORK / "tokenizer")
    target.add_argument("--corpus", type=Path, default=DEFAULT_WORK / "corpus")
    target.add_argument("--workdir", type=Path, default=DEFAULT_WORK / "target")
    target.add_argument("--out", type=Path, default=Path("assets") / "target")
    target.add_argument("--steps", type=int, default=3100, help="0 exports the latest checkpoint without training")
    target.add_argument("--batch-size", type=int, default=32)
    target.add_argument("--seq-len", type=int, default=256)
    target.add_argument("--lr", type=float, default=2e-3)
    target.add_argument("--hidden-size", type=int, default=256)
    target.add_argument("--layers", type=int, default=6)
    target.add_argument("--intermediate-size", type=int, default=640)
    target.add_argument("--no-bf16", action="store_true")


def add_drafter_steps(steps: argparse._SubParsersAction) -> None:
    """drafter, ar-drafter: distilled from any HF causal-LM target."""
    for name, help_text in (
        ("drafter", "the diffusion drafter, by self-distillation (any HF causal-LM target)"),
        ("ar-drafter", "the classic autoregressive drafter, distilled on the same data"),
    ):
        step = steps.add_parser(name, help=help_text)
        add_distillation_args(step, name)
        add_training_args(step)
        add_device_arg(step)
        if name == "drafter":
            add_diffusion_drafter_args(step)


def add_distillation_args(step: argparse.ArgumentParser, name: str) -> None:
    """The target, the text it continues, and the target-written sequences both drafters train on."""
    step.add_argument("--target", default=str(Path("assets") / "target"), help="HF causal LM: directory or Hub id")
    step.add_argument(
        "--data",
        type=Path,
        nargs="+",
        default=[DEFAULT_WORK / "corpus"],
        help="text files, or a corpus directory with train.bin in the target's tokenizer",
    )
    step.add_argument("--workdir", type=Path, default=DEFAULT_WORK / name)
    step.add_argument(
        "--distill-dir",
        type=Path,
        default=DEFAULT_WORK / "distill",
        help="target-written sequences, shared by both drafters (written once, resumable)",
    )
    step.add_argument("--out", type=Path, default=Path("assets") / name.replace("-", "_"))
    step.add_argument("--sequences", type=int, default=8192, help="distilled sequences to write")
    step.add_argument(
        "--distill-seed",
        type=int,
        default=0,
        help="seed of the distillation's prompts and samples (another seed: other sequences, in another --distill-dir)",
    )
    step.add_argument(
        "--sample-fraction",
        type=float,
        default=0.5,
        help="share of the distilled sequences the target writes by sampling (the rest greedy)",
    )
    step.add_argument("--prompt-len", type=int, default=96)
    step.add_argument(
        "--turns",
        type=int,
        default=0,
        help="prompts end at one of a conversation's first N replies (a chat template's; 0: at any reply)",
    )
    step.add_argument(
        "--clean-openings",
        action="store_true",
        help="with --turns: a prompt holds its own conversation only (as the app asks), padded and masked on the left",
    )
    step.add_argument("--new-tokens", type=int, default=96)
    step.add_argument("--distill-batch", type=int, default=64, help="rows the target continues at once")
    add_target_dtype_arg(step)


def add_training_args(step: argparse.ArgumentParser) -> None:
    """The optimisation, shared by both drafters."""
    step.add_argument("--steps", type=int, default=2000)
    step.add_argument("--batch-size", type=int, default=16)
    step.add_argument("--lr", type=float, default=1e-3)
    step.add_argument("--layers", type=int, help="model depth (default 2; with --init, the init drafter's or more)")
    step.add_argument("--no-bf16", action="store_true")
    step.add_argument(
        "--soft",
        type=float,
        default=1.0,
        help="weight of the KL to the target's distribution (soft labels) against the CE on the token",
    )


def add_diffusion_drafter_args(step: argparse.ArgumentParser) -> None:
    """The diffusion drafter's shape, recipe, evaluation and noise type."""
    step.add_argument("--block", type=int, help="trained block size L (default 8; with --init, the init drafter's)")
    step.add_argument("--anchors", type=int, default=48, help="blocks per sequence per step")
    step.add_argument(
        "--full-share",
        type=float,
        default=0.5,
        help="share of blocks masked whole (what a one-step draft reads); the rest at a random ratio",
    )
    step.add_argument("--decay", type=float, default=8.0, help="loss weight of block position j: exp(-(j-1)/decay)")
    step.add_argument(
        "--taps",
        type=int,
        nargs="+",
        help="target layers (0-based) whose hidden states the drafter reads (default: spread, last included)",
    )
    step.add_argument(
        "--tau-prompts",
        type=int,
        default=20,
        help="held-out sgd_dev chats on which each evaluation measures tau at (1, 1, 8) (0 = none)",
    )
    step.add_argument("--eval-data", type=Path, default=DEFAULT_DATA, help="the data folder holding sgd/sgd_dev.txt")
    step.add_argument(
        "--root-predicts-next",
        action="store_true",
        help="the root's output predicts the first block token (else the first masked position's)",
    )
    step.add_argument(
        "--fuse-previous",
        action="store_true",
        help="block inputs also read the target features of the token before the root (EAGLE's input); "
        "with --init, added at zero so the drafter starts as it was",
    )
    step.add_argument("--init", help="start from this drafter directory instead of a fresh one")
    add_large_target_args(step)
    step.add_argument(
        "--format",
        choices=("xpress", "dflash"),
        default="xpress",
        help="dflash: train the architecture the DFlash format holds and write --out in that format "
        "(what serving engines load; xPress loads it too)",
    )
    step.add_argument(
        "--noise",
        choices=NOISE_TYPES,
        default="mask",
        help="mask: discrete masked diffusion; gaussian: noised token embeddings (the continuous variant)",
    )
    step.add_argument(
        "--clean-rms",
        type=float,
        default=1.0,
        help="gaussian: RMS per coordinate of the clean embeddings against unit noise (lower = noisier steps)",
    )


def add_report_steps(steps: argparse._SubParsersAction) -> None:
    """eval, cards: what the model cards report."""
    ev = steps.add_parser("eval", help="tau and tokens/s of a drafter on 50 held-out sgd_dev chats (model cards)")
    ev.add_argument("--target", default=str(Path("assets") / "target"))
    ev.add_argument(
        "--drafter",
        nargs="+",
        default=[str(Path("assets") / "drafter")],
        help="one drafter, or several of one kind to compare (they take turns prompt by prompt)",
    )
    ev.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ev.add_argument("--prompts", type=int, default=50)
    ev.add_argument("--max-new-tokens", type=int, default=64)
    ev.add_argument(
        "--temperatures", type=float, nargs="+", default=[0.0], help="sampling temperatures to measure (0 = greedy)"
    )
    ev.add_argument("--out", type=Path, nargs="+", help="write each drafter's scores as JSON here (one per drafter)")

    sharp = steps.add_parser(
        "sharpness",
        help="fit how sharply greedy draft trees read a masked drafter's distribution (its tree_sharpness)",
    )
    sharp.add_argument("--target", default=str(Path("assets") / "target"))
    sharp.add_argument("--drafter", default=str(Path("assets") / "drafter"))
    sharp.add_argument("--data", type=Path, default=DEFAULT_DATA)
    sharp.add_argument("--prompts", type=Path, help="fit on these prompts instead (JSONL, as bench --prompts reads)")
    sharp.add_argument("--chats", type=int, default=30, help="held-out sgd_dev chats the benchmark does not use")
    sharp.add_argument("--stories", type=int, default=10, help="story requests of the fitting set (at most 10)")
    sharp.add_argument("--max-new-tokens", type=int, default=128, help="length of the target's replies")
    sharp.add_argument("--grid", type=float, nargs="+", help="candidate sharpnesses (default: 1 to 2.5)")
    sharp.add_argument("--write", action="store_true", help="keep the best in the drafter's config.json")

    cmp = steps.add_parser(
        "compare",
        help="rank drafters by the draft tokens accepted at every round start of the target's greedy replies to "
        "held-out chats, each against the first with its standard error (docs/experiments.md)",
    )
    cmp.add_argument("--target", default=str(Path("assets") / "target"))
    cmp.add_argument("--drafter", nargs="+", required=True, help="two or more drafters; the first is the baseline")
    cmp.add_argument("--data", type=Path, default=DEFAULT_DATA)
    cmp.add_argument("--chats", type=int, default=250, help="held-out sgd_dev chats the benchmark does not use")
    cmp.add_argument("--starts", type=int, default=64, help="round starts per reply: its first tokens")
    cmp.add_argument(
        "--settings", nargs="+", default=list(COMPARE_SETTINGS), help="K,T,L per setting (greedy, default diversity)"
    )

    curve = steps.add_parser("curve", help="draw a drafter run's learning curve (tau against tokens read) as HTML")
    curve.add_argument(
        "--run",
        nargs="+",
        required=True,
        help="NAME=LOG[,LOG...] per run (train_log.jsonl files in training order), or a bare LOG",
    )
    curve.add_argument("--seq-len", type=int, default=192, help="tokens per distilled row (prompt + new tokens)")
    curve.add_argument("--before", type=float, help="tau of the drafter the runs should beat (a dashed line)")
    curve.add_argument("--out", type=Path, default=Path("runs") / "learning_curve.html")

    cards = steps.add_parser("cards", help="write the model cards of the assets from their summaries and scores")
    cards.add_argument("--assets", type=Path, default=Path("assets"))
    cards.add_argument(
        "--commands",
        type=Path,
        required=True,
        help="JSON {target, drafter, drafter_gauss, ar_drafter}: the exact training command of each asset",
    )


def parse_settings(texts: list[str]) -> list[tuple[int, int, int]]:
    """``K,T,L`` strings -> (K, T, L) with K, T, L >= 1 and T <= L."""
    settings = []
    for text in texts:
        parts = text.split(",")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise XpressError(f"--settings takes K,T,L triples of whole numbers, got {text!r}")
        k, t, length = (int(p) for p in parts)
        if min(k, t, length) < 1 or t > length:
            raise XpressError(f"--settings {text}: K, T and L are at least 1 and T is at most L")
        settings.append((k, t, length))
    return settings


def run_compare(args: argparse.Namespace) -> list[dict]:
    import torch

    from ..data import fitting_prompts
    from ..models import Models, load_drafter, load_target
    from .compare import compare_drafters

    settings = parse_settings(args.settings)
    if len(args.drafter) < 2 or args.chats < 2 or args.starts < 1:
        raise XpressError("compare needs two drafters or more, --chats >= 2 and --starts >= 1")
    held_out = fitting_prompts(args.data, args.chats, stories=0)  # before the models: a missing folder fails fast
    target, tokenizer = load_target(args.target, torch.device("cpu"), torch.float32)
    drafters = [
        Models(target, tokenizer, load_drafter(spec, target, tokenizer, torch.device("cpu"), torch.float32))
        for spec in args.drafter
    ]
    comparisons = compare_drafters(drafters, [p.ids(tokenizer) for p in held_out], settings, args.starts)
    return [
        {
            "setting": list(c.setting),
            "prompts": len(held_out),
            "accepted": dict(zip(args.drafter, c.accepted)),
            "difference": dict(zip(args.drafter[1:], c.difference[1:])),
            "standard_error": dict(zip(args.drafter[1:], c.standard_error[1:])),
        }
        for c in comparisons
    ]


def run_eval(args: argparse.Namespace) -> list[dict]:
    from dataclasses import asdict

    import torch

    from ..models import Models, load_drafter, load_target
    from ..records import json_record
    from .evaluate import AR_DRAFT_LENGTHS, CARD_SETTINGS, evaluate, heldout_prompts

    if args.out and len(args.out) != len(args.drafter):
        raise XpressError(f"--out needs one file per drafter: {len(args.drafter)} drafters, {len(args.out)} files")
    target, tokenizer = load_target(args.target, torch.device("cpu"), torch.float32)
    drafters = {
        spec: Models(target, tokenizer, load_drafter(spec, target, tokenizer, torch.device("cpu"), torch.float32))
        for spec in args.drafter
    }
    kinds = {m.drafter.name for m in drafters.values()}
    if len(kinds) > 1:
        raise XpressError(f"compare drafters of one kind (their settings differ): got {sorted(kinds)}")
    prompts = heldout_prompts(args.data, args.prompts)
    # The AR drafter drafts left to right, one position per step: T = L, tried over draft lengths.
    settings = CARD_SETTINGS if kinds == {"diffusion"} else [(1, n, n) for n in AR_DRAFT_LENGTHS]
    scores = evaluate(drafters, prompts, settings, args.max_new_tokens, args.temperatures)
    reports = [
        {
            "target": str(args.target),
            "drafter": spec,
            "prompts": len(prompts),
            "max_new_tokens": args.max_new_tokens,
            "scores": [json_record({**asdict(s), "speedup": s.speedup}) for s in scores[spec]],
        }
        for spec in args.drafter
    ]
    for report, out in zip(reports, args.out or []):
        out.write_text(json.dumps(report, indent=2))
    return reports


def run_sharpness(args: argparse.Namespace) -> dict:
    import torch

    from ..data import FITTING_STORIES, fitting_prompts, read_prompt_file
    from ..models import Models, load_drafter, load_target
    from .sharpness import SHARPNESS_GRID, fit_sharpness, kept_config, write_sharpness

    counts_ok = 0 <= args.stories <= len(FITTING_STORIES) and args.chats >= 0 and args.chats + args.stories > 0
    if not args.prompts and not counts_ok:
        raise XpressError(f"--chats >= 0 and --stories in 0..{len(FITTING_STORIES)}, not both 0")
    grid = tuple(args.grid or SHARPNESS_GRID)
    if not all(math.isfinite(s) and s > 0 for s in grid):
        raise XpressError(f"--grid takes finite sharpnesses > 0, got {list(grid)}")
    if args.write:  # before the fit's minutes, not after
        kept_config(Path(args.drafter))
    target, tokenizer = load_target(args.target, torch.device("cpu"), torch.float32)
    drafter = load_drafter(args.drafter, target, tokenizer, torch.device("cpu"), torch.float32)
    chosen = read_prompt_file(args.prompts) if args.prompts else fitting_prompts(args.data, args.chats, args.stories)
    if not chosen:
        raise XpressError("no prompts to fit on: give --prompts a file with prompts, or --chats / --stories above 0")
    prompts = [p.ids(tokenizer) for p in chosen]
    fit = fit_sharpness(Models(target, tokenizer, drafter), prompts, grid, args.max_new_tokens)
    written = write_sharpness(Path(args.drafter), fit.sharpness) if args.write else None
    return {
        "drafter": args.drafter,
        "sharpness": fit.sharpness,
        "accepted_per_round": {str(s): round(a, 4) for s, a in fit.accepted.items()},
        "rounds": fit.rounds,
        "prompts": fit.prompts,
        "written": None if written is None else str(written),
    }


def run_train(args: argparse.Namespace) -> int:
    if args.step == "tokenizer":
        from .corpus import check_data, training_documents
        from .tokenizer import train_tokenizer

        check_data(args.data)
        docs = list(training_documents(args.data))
        tok = train_tokenizer(docs, args.vocab_size, args.out)
        print(json.dumps({"vocab_size": len(tok), "out": str(args.out)}))
    elif args.step == "corpus":
        from transformers import AutoTokenizer

        from ..models.gguf import converted_folder, is_gguf
        from .corpus import build_corpus, check_data

        check_data(args.data)  # before the tokenizer loads
        tokenizer = str(args.tokenizer)
        if is_gguf(tokenizer):  # a GGUF target's tokenizer: from its converted folder
            tokenizer = converted_folder(tokenizer)
        stats = build_corpus(args.data, AutoTokenizer.from_pretrained(tokenizer), args.out)
        print(json.dumps(stats))
    elif args.step == "target":
        from transformers import AutoTokenizer

        from .loop import TrainConfig
        from .target import TargetShape, train_target

        cfg = TrainConfig(
            steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr, bf16=not args.no_bf16
        )
        shape = TargetShape(hidden_size=args.hidden_size, layers=args.layers, intermediate_size=args.intermediate_size)
        summary = train_target(
            AutoTokenizer.from_pretrained(args.tokenizer), args.corpus, args.workdir, args.out, cfg, shape
        )
        print(json.dumps(summary))
    elif args.step == "cards":
        from .cards import write_cards

        write_cards(args.assets, json.loads(args.commands.read_text()))
        print(json.dumps({"assets": str(args.assets)}))
    elif args.step == "curve":
        from .curve import curve_points, learning_curve_figure, parse_run

        runs = {name: curve_points(logs, args.seq_len) for name, logs in map(parse_run, args.run)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        learning_curve_figure(runs, args.before).write_html(args.out, include_plotlyjs="directory")
        (args.out.with_suffix(".json")).write_text(json.dumps(runs, indent=1))
        print(json.dumps({name: len(points) for name, points in runs.items()} | {"out": str(args.out)}))
    elif args.step == "eval":
        print(json.dumps(run_eval(args)))
    elif args.step == "sharpness":
        print(json.dumps(run_sharpness(args)))
    elif args.step == "compare":
        print(json.dumps(run_compare(args)))
    elif args.step == "refiner":
        print(json.dumps(run_refiner_step(args)))
    elif args.step == "draft-vocab":
        print(json.dumps(run_draft_vocab_step(args)))
    else:
        print(json.dumps(run_drafter_step(args)))
    return 0


def run_drafter_step(args: argparse.Namespace) -> dict:
    import torch

    if args.step == "drafter" and not 0 <= args.full_share <= 1:
        raise XpressError(f"--full-share is a share of blocks, 0 to 1; got {args.full_share}")
    if not 0 <= args.sample_fraction <= 1:
        raise XpressError(f"--sample-fraction is a share of sequences, 0 to 1; got {args.sample_fraction}")
    from .loop import drafter_training

    cfg = drafter_training(args, eval_every=max(50, args.steps // 10))  # first: a missing device is refused at once
    check_distillation_args(args)

    from ..models import export_dflash, init_drafter, load_target, read_conditioned_drafter
    from .ar_drafter import make_ar_drafter, train_ar_drafter
    from .distill import distillation_record, load_distillation, requested, write_distillation
    from .drafter import extend_drafter, in_dflash_layout, store_bf16, tie_key_norms, train_drafter

    device = torch.device(cfg.device)
    target, tokenizer = load_target(args.target, device, target_dtype(args))
    distilled = write_distillation(target, tokenizer, args.data, args.distill_dir, requested(args))
    seqs = load_distillation(distilled).to(device)
    written_by = distillation_record(args.distill_dir)
    if args.step == "ar-drafter":
        model = make_ar_drafter(target, args.layers or 2).to(device)
        return train_ar_drafter(model, seqs, cfg, args.workdir, args.out, tokenizer, target, args.soft, written_by)
    from ..drafters.dflash_format import export_refusals, serving_taps

    init_dir = Path(args.init) if args.init else args.workdir / "init"
    if not args.init and not (init_dir / "config.json").exists():
        init_drafter(
            args.target,
            init_dir,
            layers=args.layers or 2,
            block=args.block or 8,
            noise=args.noise,
            clean_rms=args.clean_rms,
            tapped_layers=args.taps,
            fuse_previous=args.fuse_previous,
            dflash_layout=args.format == "dflash",
        )
    drafter = read_conditioned_drafter(init_dir)
    if args.init and args.format == "dflash" and export_refusals(drafter.config):  # start from a drafter of ours
        drafter = in_dflash_layout(drafter, args.taps or serving_taps(drafter.config.target_num_layers))
    if args.init and (args.taps or args.block or args.layers or args.fuse_previous):
        taps = args.taps or drafter.config.tapped_layers
        drafter = extend_drafter(drafter, taps, args.block, args.layers, args.fuse_previous)
    if args.root_predicts_next:  # a readout choice: no weight changes, so an --init drafter can switch to it
        drafter.config.root_predicts_next = True
    if drafter.config.noise != args.noise:
        raise XpressError(f"{init_dir} holds a {drafter.config.noise!r} drafter; --noise asks for {args.noise!r}")
    if args.format == "dflash" and (refusals := export_refusals(drafter.config)):  # before training, not after
        raise XpressError(f"--format dflash: the drafter cannot be written in the DFlash format: {'; '.join(refusals)}")
    if args.format == "dflash":
        tie_key_norms(drafter)
    drafter = drafter.to(device)
    summary = train_drafter(
        drafter,
        target,
        seqs,
        args.prompt_len,
        cfg,
        args.workdir,
        args.out,
        tokenizer,
        anchors=args.anchors,
        decay=args.decay,
        soft=args.soft,
        full_share=args.full_share,
        tau_eval=tau_curve(target, tokenizer, drafter, args, seqs) if args.tau_prompts else None,
        continued_from=read_summary(Path(args.init)) if args.init else None,
        distillation=written_by,
        cache_features=args.cache_features,
    )
    if args.format == "dflash":
        export_dflash(args.out, args.out)
    if args.save_bf16:
        store_bf16(args.out)
    return summary


def check_distillation_args(args: argparse.Namespace) -> None:
    """Before the target loads: enough rows to train on beside the held-out ones, and data the distillation reads."""
    from .distill import check_clean
    from .loop import HELD_OUT

    check_cached_features(args)
    if args.clean_openings and getattr(args, "step", None) == "ar-drafter":
        raise XpressError(
            "--clean-openings rows hold masked pads, which `train ar-drafter` does not read: leave it out"
        )
    check_clean(args.turns, args.clean_openings)  # before the target loads, as prompt_ends would after
    if args.sequences < HELD_OUT + args.batch_size:
        raise XpressError(
            f"--sequences {args.sequences}: the first {HELD_OUT} are held out, so at least {HELD_OUT + args.batch_size} "
            f"are needed to draw a batch of {args.batch_size}"
        )
    for path in args.data:
        if not path.exists():
            raise XpressError(f"--data {path}: no such file or folder")
        if path.is_dir() and not (path / "train.bin").exists():
            raise XpressError(
                f"--data {path} is a folder without train.bin: pass text files, or a corpus folder that "
                "`train corpus --tokenizer TARGET` wrote in the target's tokenizer"
            )


def tau_curve(target, tokenizer, drafter, args: argparse.Namespace, seqs):
    """The learning curve's measure: tau and per-position acceptance at (1, 1, 8) on held-out chats, greedy. A target
    without a chat template (a story model) reads raw text instead: the prompts of the distillation's held-out rows,
    which training never reads (``split_held_out``)."""
    from ..drafters.diffusion import diffusion_drafter
    from ..models import Models, target_banned_ids
    from .evaluate import acceptance_profile, heldout_prompts
    from .loop import split_held_out

    if tokenizer.chat_template is None:
        prompts = [row[: args.prompt_len][None] for row in split_held_out(seqs)[0][: args.tau_prompts]]
    else:
        prompts = [p.ids(tokenizer) for p in heldout_prompts(args.eval_data, args.tau_prompts)]
    models = Models(target, tokenizer, diffusion_drafter(drafter, target_banned_ids(target, tokenizer)))
    return lambda: acceptance_profile(models, prompts, block=min(8, drafter.config.block_size))


def read_summary(drafter_dir: Path) -> dict | None:
    path = drafter_dir / "training_summary.json"
    return json.loads(path.read_text()) if path.exists() else None
