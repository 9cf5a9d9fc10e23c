"""``python -m xpress_core``: generate, init-drafter, bench, train."""

from __future__ import annotations

import argparse

from .train.cli import add_train_parser, run_train


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m xpress_core")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "train":
        return run_train(args)
    return 2
