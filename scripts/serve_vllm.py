"""A DFlash-format drafter of ours served by vLLM, against xPress, side by side (README "Serving at scale").

    bash scripts/serve_vllm.sh [--drafter assets/drafter_dflash]
        [--prompts 24] [--max-new-tokens 64] [--concurrency 1 8 32] [--drafts-of 0] [--out runs/serve_vllm.json]

vLLM runs in a venv of its own (``scripts/serve_vllm.sh`` builds it; the product never needs it): this script encodes
the held-out chats once with the target's chat template and hands the same token ids to ``scripts/vllm_side.py`` in
that venv, which runs vLLM plain and with the drafter (greedy, fp32, eager). Here, in the project's environment, xPress
decodes the same ids: the target's own ``generate``, the engine without a drafter, one chain draft of L tokens (the
draft vLLM makes: one block, no tree) and ``auto``. Then it reports, side by side:

- outputs: every engine's greedy tokens against ``generate``'s, prompt by prompt;
- acceptance of the same chain in both engines: draft tokens accepted per round, and per block position the share of
  rounds that accepted it (vLLM's own counters against xPress's rounds);
- tokens/s one request at a time, and with 8 and 32 requests at once (vLLM batches them; xPress runs them in as
  many threads over the shared models, as the app does with ``--concurrency``);
- with ``--drafts-of I``: prompt I's drafts round by round in both engines.

Timings are wall-clock seconds of whole requests on whatever else the machine is doing: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from xpress_core.config import DecodeConfig
from xpress_core.data import evaluation_prompts, read_prompt_file
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import calibrated, decode
from xpress_core.models import Models, load_models
from xpress_core.trace import DecodeResult, RoundTrace

ROOT = Path(__file__).resolve().parents[1]
VLLM_SIDE = ROOT / "scripts" / "vllm_side.py"


@dataclass(frozen=True)
class Run:
    """One engine's greedy requests: the new tokens per prompt, its rounds' accepted draft tokens, and per prompt
    the (one) draft each round verified."""

    outputs: list[list[int]]
    accepted: list[int]  # per drafting round, all prompts
    drafts: list[list[list[int]]]


def xpress_run(models: Models, prompts: list[torch.Tensor], cfg: DecodeConfig) -> Run:
    outputs, accepted, drafts = [], [], []
    for ids in prompts:
        drafts.append([])
        for event in decode(models, ids, cfg):
            if isinstance(event, DecodeResult):
                outputs.append(list(event.token_ids))
            elif isinstance(event, RoundTrace) and event.drafts:  # a drafting round (not the prefill, not a plain step)
                accepted.append(len(event.accepted))
                drafts[-1].append(list(event.drafts[0]))
    return Run(outputs, accepted, drafts)


def scored(drafts: list[list[list[int]]], outputs: list[list[int]]) -> list[int]:
    """Draft tokens accepted per round when each prompt's drafts, round by round, meet its greedy reply: a round
    starting after ``done`` tokens accepts its draft's longest prefix that the reply continues with, then the
    target's own token. One rule for both engines' drafts; tokens past the reply's end (its stop) are not counted,
    which an engine's own counter may do in a request's last round."""
    accepted = []
    for rounds, reply in zip(drafts, outputs):
        done = 1  # the prefill's token
        for draft in rounds:
            if done >= len(reply):
                break  # a proposal after the last round, never verified
            a = 0
            while a < len(draft) and done + a < len(reply) and draft[a] == reply[done + a]:
                a += 1
            accepted.append(a)
            done += a + 1
    return accepted


def generate_outputs(models: Models, prompts: list[torch.Tensor], new: int) -> list[list[int]]:
    out = []
    for ids in prompts:
        full = models.target.generate(ids, max_new_tokens=new, do_sample=False)
        out.append(full[0, ids.shape[1] :].tolist())
    return out


def tokens_per_s(models: Models, prompts: list[torch.Tensor], cfg: DecodeConfig, concurrency: int) -> float:
    """New tokens per wall second: the prompts one at a time (1), else ``concurrency`` requests at once in as many
    threads (the prompts cycled), after one warm-up request."""

    def one(ids: torch.Tensor) -> int:
        *_, result = decode(models, ids, cfg)
        return len(result.token_ids)

    one(prompts[0])
    requests = prompts if concurrency == 1 else [prompts[i % len(prompts)] for i in range(concurrency)]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        tokens = sum(pool.map(one, requests))
    return tokens / (time.perf_counter() - started)


def mean(values: list[int]) -> float:
    return round(sum(values) / max(len(values), 1), 4)


def per_position(accepted: list[int], block: int) -> list[float]:
    """Per block position j = 1..L: the share of rounds that accepted at least j draft tokens."""
    return [round(sum(a >= j for a in accepted) / max(len(accepted), 1), 4) for j in range(1, block + 1)]


def vllm_side(python: str, job: dict) -> dict:
    """``scripts/vllm_side.py`` in vLLM's venv, on ``job``; its JSON answer."""
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        subprocess.run([python, str(VLLM_SIDE), str(job_path), str(out_path)], check=True, env=env)
        return json.loads(out_path.read_text())


def compare(args: argparse.Namespace) -> dict:
    # auto's stage costs measured once, as the app and the bench keep them (else every request measures them anew)
    models = calibrated(load_models(args.target, args.drafter, device="cpu", dtype="float32"))
    chats = read_prompt_file(args.prompts_file) if args.prompts_file else evaluation_prompts(["sgd_dev"])
    prompts = [p.ids(models.tokenizer) for p in chats[: args.prompts]]
    job = {
        "target": str(Path(args.target).resolve()),
        "drafter": str(Path(args.drafter).resolve()),
        "prompts": [ids[0].tolist() for ids in prompts],
        "max_new_tokens": args.max_new_tokens,
        "block": args.block,
        "concurrency": args.concurrency,
    }
    theirs = vllm_side(args.vllm_python, job)
    chain = DecodeConfig(drafts=1, steps=1, block=args.block, diversity="none", max_new_tokens=args.max_new_tokens)
    engines = {  # the engine without a drafter, the drafter's chain (what vLLM drafts), auto
        "xpress plain": (Models(models.target, models.tokenizer, NoDrafter()), chain),
        "xpress chain": (models, chain),
        "xpress auto": (models, replace(chain, auto=True, diversity="tree")),
    }
    reference = generate_outputs(models, prompts, args.max_new_tokens)
    ours = {name: xpress_run(engine, prompts, cfg) for name, (engine, cfg) in engines.items()}
    outputs = {"vllm plain": theirs["plain"]["outputs"], "vllm + drafter": theirs["spec"]["outputs"]}
    outputs |= {name: run.outputs for name, run in ours.items()}
    differ = {name: [i for i, (a, b) in enumerate(zip(out, reference)) if a != b] for name, out in outputs.items()}
    speed = {"vllm plain": theirs["plain"]["tokens_per_s"], "vllm + drafter": theirs["spec"]["tokens_per_s"]}
    for name, (engine, cfg) in engines.items():
        speed[name] = {str(c): round(tokens_per_s(engine, prompts, cfg, c), 1) for c in args.concurrency}
    return {
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "block": args.block,
        "vllm_version": theirs["version"],
        "outputs_equal_generate": {name: not parted for name, parted in differ.items()},
        "prompts_that_differ": differ,
        **acceptance(theirs["spec"], ours["xpress chain"], reference, args.block),
        "tokens_per_s": speed,
        "drafts": None
        if args.drafts_of is None
        else {"vllm": theirs["spec"]["drafts"][args.drafts_of], "xpress": ours["xpress chain"].drafts[args.drafts_of]},
    }


def acceptance(spec: dict, chain: Run, reference: list[list[int]], block: int) -> dict:
    """The same chain in both engines: each engine's own count of accepted draft tokens per round and per position,
    both engines' drafts scored by one rule against the replies, and how many rounds' drafts differ at all."""
    same_rule = {"vllm": scored(spec["drafts"], reference), "xpress": scored(chain.drafts, reference)}
    return {
        "accepted_per_round": {
            "vllm": spec["accepted_per_round"],
            "xpress": mean(chain.accepted),
            **{f"{name}, one rule": mean(acc) for name, acc in same_rule.items()},
        },
        "accepted_per_position": {
            "vllm": spec["accepted_per_position"],
            "xpress": per_position(chain.accepted, block),
            **{f"{name}, one rule": per_position(acc, block) for name, acc in same_rule.items()},
        },
        "rounds": {"vllm": spec["rounds"], "xpress": len(chain.accepted)},
        "rounds_whose_drafts_differ": sum(a != b for x, y in zip(spec["drafts"], chain.drafts) for a, b in zip(x, y)),
    }


def report(result: dict) -> str:
    head = f"{result['prompts']} held-out chats, {result['max_new_tokens']} new tokens, greedy fp32"
    lines = [f"{head}, vLLM {result['vllm_version']}"]
    for name, same in result["outputs_equal_generate"].items():
        differ = result["prompts_that_differ"][name]
        lines.append(f"  {name:15s} equal to generate: {'yes' if same else f'no, prompts {differ}'}")
    acc, pos, rounds = result["accepted_per_round"], result["accepted_per_position"], result["rounds"]
    lines.append(
        f"  one chain of {result['block']}: rounds whose drafts differ between the engines: "
        f"{result['rounds_whose_drafts_differ']}"
    )
    lines.append(
        f"  accepted draft tokens per round, each engine's own count: vLLM {acc['vllm']:.3f} over "
        f"{rounds['vllm']} rounds, xPress {acc['xpress']:.3f} over {rounds['xpress']}"
    )
    lines.append(
        f"  the same, both engines' drafts scored by one rule against the reply: vLLM "
        f"{acc['vllm, one rule']:.3f}, xPress {acc['xpress, one rule']:.3f}"
    )
    for name in pos:
        lines.append(f"  per position, {name + ':':18s} {' '.join(f'{x:.3f}' for x in pos[name])}")
    concurrency = list(next(iter(result["tokens_per_s"].values())))
    lines.append("  tokens/s at " + " / ".join(concurrency) + " requests at once:")
    for name, by in result["tokens_per_s"].items():
        lines.append(f"    {name:15s} " + " / ".join(f"{by[c]:.1f}" for c in concurrency))
    if result["drafts"]:
        for i, (a, b) in enumerate(zip(result["drafts"]["vllm"] or [], result["drafts"]["xpress"])):
            lines.append(f"  round {i + 1}: vLLM {a} xPress {b}{'' if a == b else '  <- differ'}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default=os.environ.get("XPRESS_VLLM_PYTHON"), help="vLLM venv's python")
    parser.add_argument("--target", default=str(ROOT / "assets" / "target"))
    parser.add_argument("--drafter", default=str(ROOT / "assets" / "drafter_dflash"))
    parser.add_argument("--prompts", type=int, default=24, help="how many prompts (the first of the file)")
    parser.add_argument(
        "--prompts-file", type=Path, help="JSONL as bench --prompts reads (default: the held-out chats)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--block", type=int, default=8, help="draft tokens per round (vLLM's num_speculative_tokens)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--drafts-of", type=int, help="show this prompt's drafts round by round in both engines")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    if not args.vllm_python:
        parser.error("--vllm-python (or XPRESS_VLLM_PYTHON): the python of the venv vLLM is installed in")
    result = compare(args)
    print(report(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
