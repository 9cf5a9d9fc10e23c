"""``python -m xpress_core train refiner``: the drafter's refiner head (train/refiner.py), on a distillation folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import XpressError

DEFAULT_WORK = Path("runs")


def add_refiner_step(steps: argparse._SubParsersAction) -> None:
    step = steps.add_parser("refiner", help="the drafter's causal refiner head (T > 1 = refinement passes)")
    step.add_argument("--target", default=str(Path("assets") / "target"), help="HF causal LM: directory or Hub id")
    step.add_argument("--drafter", type=Path, default=Path("assets") / "drafter", help="the drafter to give a head")
    step.add_argument("--distill-dir", type=Path, default=DEFAULT_WORK / "distill", help="target-written sequences")
    step.add_argument(
        "--data", type=Path, nargs="+", default=[DEFAULT_WORK / "corpus"], help="corpus, when chunks are missing"
    )
    step.add_argument("--sequences", type=int, help="distilled sequences to write first (default: the folder as it is)")
    step.add_argument("--distill-seed", type=int, default=0)
    step.add_argument("--sample-fraction", type=float, default=0.5)
    step.add_argument("--prompt-len", type=int, default=96)
    step.add_argument("--turns", type=int, default=0, help="prompts end at a conversation's first N replies (0: any)")
    step.add_argument("--clean-openings", action="store_true", help="with --turns: each prompt its conversation alone")
    step.add_argument("--new-tokens", type=int, default=96)
    step.add_argument("--distill-batch", type=int, default=64, help="rows the target continues at once")
    step.add_argument("--workdir", type=Path, default=DEFAULT_WORK / "refiner")
    step.add_argument("--out", type=Path, default=DEFAULT_WORK / "refiner" / "out")
    step.add_argument("--steps", type=int, default=1500)
    step.add_argument("--batch-size", type=int, default=8)
    step.add_argument("--lr", type=float, default=2e-3)
    step.add_argument("--rank", type=int, default=128, help="the head's width r")
    step.add_argument("--passes", type=int, default=2, help="free-running passes trained")
    step.add_argument("--free-weight", type=float, default=0.3, help="weight of the free-running passes' loss")
    step.add_argument("--anchors", type=int, default=16, help="blocks per sequence per step")
    step.add_argument("--decay", type=float, default=4.0, help="loss weight of block position j: exp(-(j-1)/decay)")
    step.add_argument("--soft", type=float, default=1.0, help="weight of the KL to the target's distribution")
    step.add_argument("--co-train", action="store_true", help="train the drafter along (with its own loss)")
    step.add_argument(
        "--replies-only",
        action="store_true",
        help="blocks and loss on the rows' reply tokens only (what decoding drafts; chat rows), not the user turns",
    )
    step.add_argument(
        "--drafter-lr", type=float, default=1.0, help="co-training: the drafter's learning rate over the head's (--lr)"
    )
    step.add_argument(
        "--drafter-weight",
        type=float,
        default=0.6,
        help="co-training: the weight of the drafter's own loss (pass 0's, what T = 1 drafts from) beside the head's",
    )
    step.add_argument("--eval-every", type=int, default=250)
    step.add_argument(
        "--dialogue-rows",
        type=int,
        default=128,
        help="held-out dialogues (the --data corpus's val.bin) continued by the target: the curve on their replies",
    )
    step.add_argument("--no-bf16", action="store_true")
    add_target_dtype_arg(step)
    add_large_target_args(step)
    add_device_arg(step)


def add_target_dtype_arg(step: argparse.ArgumentParser) -> None:
    step.add_argument(
        "--target-dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="the target's dtype while it writes and is read (bf16: what decoding runs on a CPU with native bf16)",
    )


def target_dtype(args: argparse.Namespace):
    """The torch dtype ``--target-dtype`` asks for."""
    import torch

    return torch.bfloat16 if args.target_dtype == "bf16" else torch.float32


def check_cached_features(args: argparse.Namespace) -> None:
    """Cached features hold no logits: ``--cache-features`` trains on the rows' tokens only."""
    if getattr(args, "cache_features", False) and args.soft > 0:
        raise XpressError("--cache-features keeps the target's features, not its logits: it trains with --soft 0")


def add_large_target_args(step: argparse.ArgumentParser) -> None:
    """What training a diffusion drafter or its head for a large target on a CPU needs: its features read once,
    the result stored in bf16."""
    step.add_argument(
        "--cache-features",
        action="store_true",
        help="read the target over the training rows once and keep its features in --workdir (a large target: "
        "its forward then costs nothing per step); trains on the rows' tokens (--soft 0)",
    )
    step.add_argument(
        "--save-bf16",
        action="store_true",
        help="store --out in bf16: half the file, what the engine runs on CPU (it trains in fp32 either way)",
    )


def add_device_arg(step: argparse.ArgumentParser) -> None:
    """``--device`` and ``--max-minutes`` of the training steps that read a target (drafter, ar-drafter, refiner)."""
    step.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda or cuda:N: the target, the model trained and every batch live there (bf16 autocast there "
        "unless --no-bf16); the distillation is written there too",
    )
    step.add_argument(
        "--max-minutes",
        type=float,
        help="stop training after so many minutes (checkpointed; the model is written as it is, a rerun resumes)",
    )


def run_refiner_step(args: argparse.Namespace) -> dict:
    import torch

    from ..drafters.diffusion_model import XpressDrafter
    from ..models import load_target
    from .distill import (
        distillation_record,
        held_out_dialogue_rows,
        load_distillation,
        requested,
        write_distillation,
    )
    from .drafter import reply_tokens, store_bf16
    from .loop import drafter_training
    from .refiner import RefinerRecipe, attach_refiner, train_refiner

    cfg = drafter_training(args, eval_every=args.eval_every)  # first: a missing device is refused before loading
    device = torch.device(cfg.device)
    check_cached_features(args)  # before the target loads
    target, tokenizer = load_target(args.target, device, target_dtype(args))
    if args.sequences:  # write what is missing first (resumable), else train on the chunks the folder holds
        write_distillation(target, tokenizer, args.data, args.distill_dir, requested(args))
    seqs = load_distillation(args.distill_dir).to(device)
    written_by = distillation_record(args.distill_dir)  # the settings, and how many chunks the folder held
    recipe = RefinerRecipe(
        rank=args.rank,
        passes=args.passes,
        free_weight=args.free_weight,
        co_train=args.co_train,
        drafter_lr=args.drafter_lr,
        drafter_weight=args.drafter_weight,
        anchors=args.anchors,
        decay=args.decay,
        soft=args.soft,
        replies_only=args.replies_only,
    )
    summary_path = args.drafter / "training_summary.json"
    summary = train_refiner(
        # fp32 whatever the folder stores (a drafter kept in bf16, --save-bf16): the optimizer steps fp32 weights.
        attach_refiner(XpressDrafter.from_pretrained(args.drafter, dtype=torch.float32), args.rank).to(device),
        target,
        seqs,
        args.prompt_len,
        cfg,
        recipe,
        args.workdir,
        args.out,
        tokenizer,
        distillation=written_by and written_by | {"chunks": len(list(args.distill_dir.glob("chunk_*.pt")))},
        continued_from=json.loads(summary_path.read_text()) if summary_path.exists() else None,
        # Their curve counts reply tokens: a tokenizer without role tokens gets none, so no rows are continued.
        dialogue_rows=held_out_dialogue_rows(target, tokenizer, args.data, args.dialogue_rows, requested(args))
        if reply_tokens(tokenizer)
        else None,
        cache_features=args.cache_features,
    )
    if args.save_bf16:
        store_bf16(args.out)
    return summary
