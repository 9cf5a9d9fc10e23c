"""One exact decode, as a user runs it: ``python -m xpress_core generate --json`` on the embedded models, its tokens
against transformers' greedy ``generate`` of the same target (loaded here by transformers alone, the prompt encoded
by the tokenizer alone). Run by the oldest-dependencies CI step (scripts/oldest_deps.sh) and the device run's smoke
stage (scripts/device_run.py). Exit 0 when every decode equals ``generate``, 1 otherwise; one JSON line per decode.

    python scripts/exact_decode.py [--device cpu|cuda] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ("Once upon a time", "I want to book a table for two")
# The drafters a user meets first: the embedded diffusion drafter (auto, then pinned with a tree) and the AR one;
# each decode loads the models afresh (a few seconds), so each takes one prompt.
DECODES = (
    (PROMPTS[0], "assets/drafter", ()),
    (PROMPTS[1], "assets/drafter", ("-K", "3", "-T", "2", "-L", "8", "--verify", "tree")),
    (PROMPTS[1], "assets/ar_drafter", ("--drafter-kind", "autoregressive", "-K", "1", "-L", "4")),
)


def generate_cli(prompt: str, drafter: str, options: tuple[str, ...], device: str, new_tokens: int) -> list[int]:
    cmd = [sys.executable, "-m", "xpress_core", "generate", "--prompt", prompt, "--drafter", drafter, *options]
    cmd += ["--device", device, "--dtype", "float32", "--max-new-tokens", str(new_tokens), "--json"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, env={**os.environ})
    if done.returncode != 0:
        raise SystemExit(f"generate failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)["token_ids"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--decodes", type=int, default=len(DECODES), help="only the first N (the device's smoke: 1)")
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "assets" / "target")
    target = AutoModelForCausalLM.from_pretrained(ROOT / "assets" / "target", dtype=torch.float32).to(args.device)
    failures = 0
    for prompt, drafter, options in DECODES[: args.decodes]:
        ids = torch.tensor([tokenizer(prompt)["input_ids"]], device=args.device)
        with torch.no_grad():
            expected = target.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)[0, ids.shape[1] :].tolist()
        got = generate_cli(prompt, drafter, options, args.device, args.new_tokens)
        failures += got != expected
        print(json.dumps({"prompt": prompt, "drafter": drafter, "options": options, "equal": got == expected}))
        if got != expected:
            print(f"  xpress   {got}\n  generate {expected}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
