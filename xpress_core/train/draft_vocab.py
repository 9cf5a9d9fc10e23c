"""``python -m xpress_core train draft-vocab``: a drafter's draft vocabulary, the tokens its target writes most in the
distillation it learned from (``drafters/draft_vocab.py`` says why)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from ..errors import XpressError

SUMMARY = "training_summary.json"


def add_draft_vocab_step(steps: argparse._SubParsersAction) -> None:
    step = steps.add_parser(
        "draft-vocab",
        help="let a drafter draft from the N tokens its target writes most (a cheaper head; the output is unchanged)",
    )
    step.add_argument("--drafter", type=Path, required=True, help="a folder of our drafter (XpressDrafter)")
    step.add_argument("--distill-dir", type=Path, required=True, help="the distillation it was trained on")
    step.add_argument("--size", type=int, default=16384, help="tokens in the draft vocabulary")
    step.add_argument("--out", type=Path, help="where to write the drafter (default: --drafter, in place)")


def run_draft_vocab_step(args: argparse.Namespace) -> dict:
    import torch

    from ..drafters.diffusion_model import XpressDrafter
    from ..drafters.draft_vocab import frequent_tokens, with_draft_vocab
    from .distill import distillation_record, load_distillation
    from .loop import split_held_out

    record = distillation_record(args.distill_dir)
    if record is None:
        raise XpressError(f"{args.distill_dir} has no distill.json: which tokens the target wrote is unknown")
    try:
        drafter = XpressDrafter.from_pretrained(args.drafter, dtype="auto")
    except (OSError, ValueError) as error:
        raise XpressError(f"--drafter {args.drafter}: not a drafter of ours ({error})") from error
    cfg = drafter.config
    if not 0 < args.size < cfg.vocab_size:
        raise XpressError(f"--size is a number of tokens, 1 to {cfg.vocab_size - 1}; got {args.size}")
    if cfg.output_multiplier != 1.0 or cfg.final_logit_softcapping:
        raise XpressError("the drafter scales or caps its logits, which would lift the tokens left out above -inf")
    held_out, trained = split_held_out(load_distillation(args.distill_dir))
    start = record["prompt_len"]  # the tokens the target wrote, not the prompts'
    ids = frequent_tokens(trained[:, start:], args.size, cfg.vocab_size)
    held_written = held_out[:, start:].flatten()
    coverage = float(torch.isin(held_written, ids).float().mean())
    out = args.out or args.drafter
    if out != args.drafter:
        shutil.copytree(args.drafter, out, dirs_exist_ok=True)  # its tokenizer, card and summaries along
    with_draft_vocab(drafter, ids).save_pretrained(out)
    figures = {
        "size": args.size,
        "counted_tokens": int(trained[:, start:].numel()),
        "held_out_coverage": round(coverage, 4),
        "distillation": record,
    }
    summary_path = out / SUMMARY
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        summary_path.write_text(json.dumps(summary | {"draft_vocab": figures}, indent=1))
    return {"out": str(out)} | figures
