"""Write the shipped prompt sets, ``xpress_core/prompts/<set>.jsonl``, from the data folder (run once; rerun only
when the sets are meant to change, since the benchmark's figures are measured on them).

    python -m scripts.make_prompts [--data ../shared/data] [--out xpress_core/prompts]

The sets come from ``xpress_core.data.derive_prompt_sets``: the held-out Schema-Guided Dialogue chats (its dev
split, never trained on), the single-turn ones, the story requests, and ``bench --quick``'s few. A test checks that
the shipped files equal what this writes wherever the data folder is present.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from xpress_core.data import DEFAULT_DATA, PROMPTS, derive_prompt_sets, prompt_lines


def prompt_files(data_dir: Path) -> dict[str, str]:
    """Each set's file name and its text."""
    return {f"{name}.jsonl": prompt_lines(prompts) for name, prompts in derive_prompt_sets(data_dir).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=PROMPTS)
    args = parser.parse_args()
    for name, text in prompt_files(args.data).items():
        (args.out / name).write_text(text, encoding="utf-8")
        print(f"{args.out / name}: {text.count(chr(10))} prompts, {len(text.encode())} bytes")


if __name__ == "__main__":
    main()
