"""``python -m xpress_core train STEP``: each step resumable, each writing a Hugging Face format directory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
DEFAULT_WORK = Path("runs")


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train the embedded models (or a drafter for your own target)")
    steps = train.add_subparsers(dest="step", required=True)

    tok = steps.add_parser("tokenizer", help="byte-level BPE with chat special tokens")
    tok.add_argument("--data", type=Path, default=DEFAULT_DATA)
    tok.add_argument("--vocab-size", type=int, default=4096)
    tok.add_argument("--out", type=Path, default=DEFAULT_WORK / "tokenizer")

    corpus = steps.add_parser("corpus", help="tokenize shared/data into train.bin / val.bin")
    corpus.add_argument("--data", type=Path, default=DEFAULT_DATA)
    corpus.add_argument("--tokenizer", type=Path, default=DEFAULT_WORK / "tokenizer")
    corpus.add_argument("--out", type=Path, default=DEFAULT_WORK / "corpus")

    target = steps.add_parser("target", help="the Llama chat target")
    target.add_argument("--tokenizer", type=Path, default=DEFAULT_WORK / "tokenizer")
    target.add_argument("--corpus", type=Path, default=DEFAULT_WORK / "corpus")
    target.add_argument("--workdir", type=Path, default=DEFAULT_WORK / "target")
    target.add_argument("--out", type=Path, default=Path("assets") / "target")
    target.add_argument("--steps", type=int, default=3100)
    target.add_argument("--batch-size", type=int, default=32)
    target.add_argument("--seq-len", type=int, default=256)
    target.add_argument("--lr", type=float, default=2e-3)
    target.add_argument("--hidden-size", type=int, default=256)
    target.add_argument("--layers", type=int, default=6)
    target.add_argument("--intermediate-size", type=int, default=640)
    target.add_argument("--no-bf16", action="store_true")


def run_train(args: argparse.Namespace) -> int:
    if args.step == "tokenizer":
        from .corpus import training_documents
        from .tokenizer import train_tokenizer

        docs = list(training_documents(args.data))
        tok = train_tokenizer(docs, args.vocab_size, args.out)
        print(json.dumps({"vocab_size": len(tok), "out": str(args.out)}))
    elif args.step == "corpus":
        from transformers import AutoTokenizer

        from .corpus import build_corpus

        stats = build_corpus(args.data, AutoTokenizer.from_pretrained(args.tokenizer), args.out)
        print(json.dumps(stats))
    elif args.step == "target":
        from transformers import AutoTokenizer

        from .loop import TrainConfig
        from .target import TargetShape, train_target

        cfg = TrainConfig(
            steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr, bf16=not args.no_bf16
        )
        shape = TargetShape(hidden_size=args.hidden_size, layers=args.layers, intermediate_size=args.intermediate_size)
        summary = train_target(AutoTokenizer.from_pretrained(args.tokenizer), args.corpus, args.workdir, args.out, cfg, shape)
        print(json.dumps(summary))
    return 0
