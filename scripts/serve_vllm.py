"""A DFlash-format drafter of ours served by vLLM, against xPress, side by side, on equal terms (README "Serving at
scale").

    OMP_NUM_THREADS=1 bash scripts/serve_vllm.sh [--threads 1] [--repeats 1] [--drafter assets/drafter_dflash]
        [--preset smollm2] [--prompts 24] [--max-new-tokens 64] [--concurrency 1 8 32]
        [--plain-dtypes float32 bfloat16] [--dtype float32] [--drafts-of 0] [--out runs/serve_vllm.json]

The drafter vLLM runs is ``--drafter``: a DFlash-format one (vLLM's ``dflash`` method), or a causal LM of the
target's vocabulary (its ``draft_model`` method; xPress runs it as its autoregressive drafter). ``--preset`` takes
the target and xPress's default drafter from a preset (a GGUF target is handed to vLLM as its converted folder).

vLLM runs in a venv of its own (``scripts/serve_vllm.sh`` builds it; the product never needs it): this script encodes
the held-out chats once with the target's chat template and hands the same token ids to ``scripts/vllm_side.py`` in
that venv, which runs vLLM plain, with the drafter and with its n-gram speculation (greedy, ``--dtype``, eager).
Here, in the project's environment, xPress decodes the same ids: the target's own ``generate``, the engine without a
drafter, one chain draft of L tokens (the draft vLLM makes: one block, no tree), ``auto`` with that drafter (these in
``--dtype`` too), and xPress's default (``auto`` with the embedded drafter or the preset's, in the dtype ``--dtype
auto`` chooses on this machine, as the CLI and the app load it: ``precision.load_fastest``). Then it reports, side by
side:

- outputs: every engine's greedy tokens against fp32 ``generate``'s, prompt by prompt (in bf16 a near-tie may part
  any engine from it: a forward over several tokens rounds differently from a one-token one);
- acceptance of the same chain in both engines: draft tokens accepted per round, and per block position the share of
  rounds that accepted it (vLLM's own counters against xPress's rounds);
- tokens/s one request at a time, and with 8 and 32 requests at once (vLLM batches them; xPress runs them in as
  many threads over the shared models, as the app does with ``--concurrency``); plain decoding also in each of
  ``--plain-dtypes`` (xPress's and ``generate``'s), so that the gains start from the fastest plain decoding;
- one request at a time, the ms of a decoding step after the prefill (a plain step, or a round with the drafter)
  in both engines (vLLM's by its own request metrics, its proposer's share timed), and xPress's rounds stage by stage
  (``scripts/round_stages.py``);
- with ``--drafts-of I``: prompt I's drafts round by round in both engines.

Equal terms by construction: both engines on ``--threads`` torch threads (OMP_NUM_THREADS for vLLM's process too);
vLLM's side runs first, in a process group of its own that has ended entirely before xPress is timed; the same token
ids; every timing after a warm-up request. Timings are wall-clock seconds of whole requests on whatever else the
machine is doing: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from xpress_core.config import DecodeConfig
from xpress_core.data import evaluation_prompts, read_prompt_file
from xpress_core.drafters.autoregressive import AutoregressiveDrafter
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import calibrated, decode
from xpress_core.models import EMBEDDED_DRAFTER, Models, load_models
from xpress_core.models.gguf import PACKAGE_PREFIX, converted_folder
from xpress_core.precision import load_fastest
from xpress_core.presets import find_preset
from xpress_core.trace import DecodeResult, RoundTrace

from .round_stages import round_stages

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


def generate_outputs_of(target, prompts: list[torch.Tensor], new: int) -> list[list[int]]:
    out = []
    for ids in prompts:
        full = target.generate(ids, max_new_tokens=new, do_sample=False)
        out.append(full[0, ids.shape[1] :].tolist())
    return out


@dataclass(frozen=True)
class Request:
    """One timed request: new tokens, decoding steps after the prefill (None: not counted), and the seconds of
    its decoding steps and of its prefill by the engine's own clock (0 where not counted)."""

    tokens: int
    steps: int | None = None
    decode_s: float = 0.0
    prefill_s: float = 0.0


def xpress_request(models: Models, cfg: DecodeConfig) -> Callable[[torch.Tensor], Request]:
    def run(ids: torch.Tensor) -> Request:
        *rounds, result = decode(models, ids, cfg)
        return Request(len(result.token_ids), len(rounds) - 1, result.time_s - result.prefill_s, result.prefill_s)

    return run


def generate_request(target, new: int) -> Callable[[torch.Tensor], Request]:
    return lambda ids: Request(len(generate_outputs_of(target, [ids], new)[0]))


def in_turns(requests: dict[str, Callable[[torch.Tensor], Request]], prompts: list[torch.Tensor], repeats: int) -> dict:
    """The engines one request at a time, taking turns prompt by prompt (``repeats`` passes), after one warm-up
    request each: on a machine whose speed drifts, engines timed one after the other are off against each other.
    Per engine: new tokens per wall second and per CPU second of this process (the latter counts what contention
    takes away from the wall clock less), and, as vLLM's side reports them, the ms of a decoding step (a plain step,
    or a round) from each request's first token to its last and of the prefill."""
    for run in requests.values():
        run(prompts[0])
    done = {name: [] for name in requests}
    for _ in range(repeats):
        for ids in prompts:
            for name, run in requests.items():
                wall, cpu = time.perf_counter(), time.process_time()
                request = run(ids)
                done[name].append((request, time.perf_counter() - wall, time.process_time() - cpu))
    found = {}
    for name, runs in done.items():
        tokens = sum(r.tokens for r, _, _ in runs)
        timing = {
            "tokens_per_s": round(tokens / sum(w for _, w, _ in runs), 1),
            "cpu_ms_per_token": round(1000 * sum(c for _, _, c in runs) / tokens, 3),
        }
        if runs[0][0].steps is not None:
            steps = sum(r.steps for r, _, _ in runs)
            timing["decode_ms_per_step"] = round(1000 * sum(r.decode_s for r, _, _ in runs) / max(steps, 1), 3)
            timing["prefill_ms"] = round(1000 * sum(r.prefill_s for r, _, _ in runs) / len(runs), 3)
        found[name] = timing
    return found


def tokens_per_s(models: Models, prompts: list[torch.Tensor], cfg: DecodeConfig, concurrency: int) -> float:
    """New tokens per wall second with ``concurrency`` requests at once in as many threads (the prompts cycled),
    after one warm-up request."""
    run = xpress_request(models, cfg)
    run(prompts[0])
    requests = [prompts[i % len(prompts)] for i in range(concurrency)]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        tokens = sum(r.tokens for r in pool.map(run, requests))
    return round(tokens / (time.perf_counter() - started), 1)


def mean(values: list[int]) -> float:
    return round(sum(values) / max(len(values), 1), 4)


def per_position(accepted: list[int], block: int) -> list[float]:
    """Per block position j = 1..L: the share of rounds that accepted at least j draft tokens."""
    return [round(sum(a >= j for a in accepted) / max(len(accepted), 1), 4) for j in range(1, block + 1)]


class OtherLoad:
    """How busy the rest of the machine was since this was made: the cores' busy time (Linux /proc/stat) less this
    process's and its waited-for children's CPU time, per wall second (1.0: one core kept busy by other jobs)."""

    def __init__(self):
        self.started, self.busy, self.ours = time.perf_counter(), machine_busy_s(), our_cpu_s()

    def cores(self) -> float:
        others = (machine_busy_s() - self.busy) - (our_cpu_s() - self.ours)
        return round(max(others, 0.0) / (time.perf_counter() - self.started), 2)


def machine_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot (/proc/stat's first line: all but idle and iowait)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def our_cpu_s() -> float:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def vllm_side(python: str, job: dict) -> dict:
    """``scripts/vllm_side.py`` in vLLM's venv, on ``job``, in a process group of its own; its JSON answer, once
    every process of that group has ended (``group_ended``), and whether any had outlived the side's own."""
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        env["OMP_NUM_THREADS"] = str(job["threads"])
        side = subprocess.Popen([python, str(VLLM_SIDE), str(job_path), str(out_path)], env=env, start_new_session=True)
        if side.wait() != 0:
            group_ended(side.pid)
            raise SystemExit(f"vLLM's side failed (exit status {side.returncode}); its output is above")
        return json.loads(out_path.read_text()) | {"processes_outlived_it": group_ended(side.pid)}


def group_ended(group: int, grace_s: float = 30.0) -> int:
    """Wait until no process of ``group`` is left (a busy engine core would take cores from xPress's timings); one
    still there after ``grace_s`` is killed. -> how many processes had outlived the group's leader."""
    deadline, outlived = time.monotonic() + grace_s, 0
    while True:
        members = [p for p in Path("/proc").iterdir() if p.name.isdigit() and process_group(p) == group]
        if not members:
            return outlived
        outlived = max(outlived, len(members))
        if time.monotonic() > deadline:
            os.killpg(group, signal.SIGKILL)
        time.sleep(0.2)


def process_group(proc: Path) -> int | None:
    """The process group of /proc/PID (its stat's fields after the parenthesised name: state, parent, group); None
    once it is gone or a zombie (which holds no core)."""
    try:
        state, _, group = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:3]
    except (OSError, ValueError):
        return None
    return None if state == "Z" else int(group)


# vLLM's runs by their names in the report: plain, with the drafter, with its n-gram speculation (vllm_side.engine)
VLLM_RUNS = {"vllm plain": "plain", "vllm + drafter": "spec", "vllm + n-gram": "ngram"}


def compare(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    # auto's stage costs measured once, as the app and the bench keep them (else every request measures them anew)
    models = calibrated(load_models(args.target, args.drafter, device="cpu", dtype=args.dtype))
    # xPress's default: its own drafter, in the dtype the CLI and the app would run it in on this machine
    default = calibrated(load_fastest(args.target, args.default_drafter, device="cpu"))
    exact = load_models(args.target, args.drafter, device="cpu", dtype="float32").target
    chats = read_prompt_file(args.prompts_file) if args.prompts_file else evaluation_prompts(["sgd_dev"])
    prompts = [p.ids(models.tokenizer) for p in chats[: args.prompts]]
    job = {
        "target": str(vllm_folder(args.target)),
        "drafter": str(Path(args.drafter).resolve()),
        "method": "draft_model" if isinstance(models.drafter, AutoregressiveDrafter) else "dflash",
        "prompts": [ids[0].tolist() for ids in prompts],
        "max_new_tokens": args.max_new_tokens,
        "block": args.block,
        "concurrency": args.concurrency,
        "threads": args.threads,
        "repeats": args.repeats,
        "dtype": args.dtype,
    }
    load = OtherLoad()
    theirs = vllm_side(args.vllm_python, job)  # first, and ended entirely before xPress is timed
    other_load = {"vllm": load.cores()}
    chain = DecodeConfig(drafts=1, steps=1, block=args.block, diversity="none", max_new_tokens=args.max_new_tokens)
    auto = replace(chain, auto=True, diversity="tree")
    plain = Models(models.target, models.tokenizer, NoDrafter())
    engines = {  # the engine without a drafter, the drafter's chain (what vLLM drafts), auto, xPress's default
        "xpress plain": (plain, chain),
        "xpress chain": (models, chain),
        "xpress auto": (models, auto),
        "xpress default": (default, auto),
    }
    reference = generate_outputs_of(exact, prompts, args.max_new_tokens)
    ours = {name: xpress_run(engine, prompts, cfg) for name, (engine, cfg) in engines.items()}
    outputs = {name: theirs[kind]["outputs"] for name, kind in VLLM_RUNS.items()}
    outputs |= {name: run.outputs for name, run in ours.items()}
    differ = {name: [i for i, (a, b) in enumerate(zip(out, reference)) if a != b] for name, out in outputs.items()}
    steps = {name: theirs[kind]["steps"] for name, kind in VLLM_RUNS.items()}
    requests = {name: xpress_request(engine, cfg) for name, (engine, cfg) in engines.items()}
    load = OtherLoad()
    steps |= in_turns(requests | plain_dtypes(args, chain), prompts, args.repeats)
    other_load["xpress"] = load.cores()
    speed = {name: theirs[kind]["tokens_per_s"] for name, kind in VLLM_RUNS.items()}
    for name, (engine, cfg) in engines.items():
        speed[name] = {
            str(c): steps[name]["tokens_per_s"] if c == 1 else tokens_per_s(engine, prompts, cfg, c)
            for c in args.concurrency
        }
    return {
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "block": args.block,
        "threads": {"xpress": torch.get_num_threads(), "vllm": theirs["plain"]["threads"]},
        "dtype": args.dtype,
        "default_dtype": {"dtype": default.dtype_choice.dtype, "why": default.dtype_choice.reason},
        "vllm_processes_outlived_its_side": theirs["processes_outlived_it"],
        "vllm_busiest_threads": theirs["plain"].get("busiest_threads"),
        "other_jobs_cores": other_load,
        "vllm_version": theirs["version"],
        "outputs_equal_generate": {name: not parted for name, parted in differ.items()},
        "prompts_that_differ": differ,
        **acceptance(theirs["spec"], ours["xpress chain"], reference, args.block),
        "ngram_accepted_per_round": theirs["ngram"]["accepted_per_round"],
        "tokens_per_s": speed,
        "one_at_a_time": steps,
        "xpress_round_stages_ms": round_stages({"plain": (plain, chain), "chain": (models, chain)}, prompts),
        "drafts": None
        if args.drafts_of is None
        else {"vllm": theirs["spec"]["drafts"][args.drafts_of], "xpress": ours["xpress chain"].drafts[args.drafts_of]},
    }


def vllm_folder(target: str) -> Path:
    """The folder vLLM loads: a GGUF target's converted one (the same weights xPress runs), else the target's own."""
    return converted_folder(target) if target.startswith(PACKAGE_PREFIX) else Path(target).resolve()


def plain_dtypes(args: argparse.Namespace, chain: DecodeConfig) -> dict[str, Callable[[torch.Tensor], Request]]:
    """Plain decoding in each of ``--plain-dtypes``: ``generate`` and xPress without a drafter (``--dtype``'s xPress is
    the comparison's own "xpress plain")."""
    found = {}
    for dtype in args.plain_dtypes:
        models = load_models(args.target, args.drafter, device="cpu", dtype=dtype)
        found[f"generate {dtype}"] = generate_request(models.target, args.max_new_tokens)
        if dtype != args.dtype:
            found[f"xpress plain {dtype}"] = xpress_request(Models(models.target, models.tokenizer, NoDrafter()), chain)
    return found


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
    head = f"{result['prompts']} held-out chats, {result['max_new_tokens']} new tokens, greedy {result['dtype']}"
    chosen = result["default_dtype"]
    lines = [f"{head}, vLLM {result['vllm_version']}; xPress's default in {chosen['dtype']} ({chosen['why']})"]
    for name, same in result["outputs_equal_generate"].items():
        differ = result["prompts_that_differ"][name]
        lines.append(f"  {name:15s} equal to fp32 generate: {'yes' if same else f'no, prompts {differ}'}")
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
    lines.append(f"  vLLM's n-gram speculation accepted {result['ngram_accepted_per_round']:.3f} draft tokens a round")
    for name in pos:
        lines.append(f"  per position, {name + ':':18s} {' '.join(f'{x:.3f}' for x in pos[name])}")
    lines += summary(result)
    lines += stages(result)
    if result["drafts"]:
        for i, (a, b) in enumerate(zip(result["drafts"]["vllm"] or [], result["drafts"]["xpress"])):
            lines.append(f"  round {i + 1}: vLLM {a} xPress {b}{'' if a == b else '  <- differ'}")
    return "\n".join(lines)


def summary(result: dict) -> list[str]:
    """The compact table: tokens/s per concurrency; one request at a time: CPU ms a token (this engine's process,
    all its threads), the ms of a step after the prefill, that step in plain steps of the same engine (in --dtype),
    and the gain at one request over that engine's fastest plain decoding (``generate`` is xPress's baseline too:
    xPress's plain decoding should reach it)."""
    speed, steps = result["tokens_per_s"], result["one_at_a_time"]
    concurrency = list(next(iter(speed.values())))
    plains = {"vllm": ["vllm plain"], "xpress": [n for n in steps if n.startswith(("xpress plain", "generate"))]}
    fastest = {engine: max(names, key=lambda n: steps[n]["tokens_per_s"]) for engine, names in plains.items()}
    threads, outlived = result["threads"], result["vllm_processes_outlived_its_side"]
    others = result["other_jobs_cores"]
    lines = [
        f"  threads: xPress {threads['xpress']}, vLLM {threads['vllm']}; vLLM's processes that outlived its side: "
        + str(outlived),
        f"  vLLM's busiest threads while timed (shares of a core): {result['vllm_busiest_threads']}",
        f"  cores other jobs kept busy (0 on a quiet machine): during vLLM's side {others['vllm']}, during xPress's "
        + f"timings {others['xpress']}, of {os.cpu_count()}",
        f"  | engine | tok/s at {' / '.join(concurrency)} | CPU ms a token | ms a step | plain steps | gain at 1 |",
        "  |---|---|---|---|---|---|",
    ]
    for name, timing in steps.items():
        engine = {"vllm": "vllm", "xpress": "xpress", "generate": "xpress"}[name.split()[0]]
        at = " / ".join(f"{speed[name][c]:.1f}" for c in concurrency) if name in speed else f"{timing['tokens_per_s']}"
        step = timing.get("decode_ms_per_step")
        # steps against the same engine's plain step in --dtype, the gain against its fastest plain decoding
        base = steps[f"{engine} plain"]["decode_ms_per_step"]
        ratio = f"{step / base:.2f}" if step else ""
        gain = f"{timing['tokens_per_s'] / steps[fastest[engine]]['tokens_per_s']:.2f}x"
        cpu, step = f"{timing['cpu_ms_per_token']:.2f}", "" if step is None else f"{step:.2f}"
        lines.append(f"  | {name} | {at} | {cpu} | {step} | {ratio} | {gain} |")
    lines.append(f"  (gains over each engine's fastest plain decoding: {fastest['vllm']}, {fastest['xpress']})")
    return lines


def stages(result: dict) -> list[str]:
    """A round's time, both engines: vLLM's proposer against the rest of its step; xPress's stages."""
    spec, plain = result["one_at_a_time"]["vllm + drafter"], result["one_at_a_time"]["vllm plain"]
    step, proposing = plain["decode_ms_per_step"], spec.get("propose_ms_per_round", 0.0)
    rest, whole = spec["decode_ms_per_step"] - proposing, spec["decode_ms_per_step"]
    vllm = f"the drafter's proposer {proposing:.2f} + the rest {rest:.2f} = {whole / step:.2f} plain steps"
    lines = [f"  vLLM, ms a round: {vllm} of {step:.2f} ms"]
    ours = result["xpress_round_stages_ms"]
    base = ours["plain"]["round (its trace's draft + verify + other)"]
    lines.append(f"  xPress, ms a round (a plain step {base:.2f} ms), in plain steps in brackets:")
    for name, ms in ours["chain"].items():
        lines.append(f"    {name:44s} {ms:7.3f} ({ms / base:.2f})   plain: {ours['plain'].get(name, 0.0):7.3f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default=os.environ.get("XPRESS_VLLM_PYTHON"), help="vLLM venv's python")
    parser.add_argument("--target", default=str(ROOT / "assets" / "target"))
    parser.add_argument("--drafter", default=str(ROOT / "assets" / "drafter_dflash"))
    parser.add_argument(
        "--preset", help="a preset's key (e.g. smollm2): its target, and its drafter as xPress's default"
    )
    parser.add_argument("--prompts", type=int, default=24, help="how many prompts (the first of the file)")
    parser.add_argument(
        "--prompts-file", type=Path, help="JSONL as bench --prompts reads (default: the held-out chats)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--block", type=int, default=8, help="draft tokens per round (vLLM's num_speculative_tokens)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=1, help="timed passes over the prompts, one request at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both engines")
    parser.add_argument(
        "--plain-dtypes", nargs="+", default=["float32", "bfloat16"], help="time plain decoding in these too"
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="both engines' dtype (vLLM plain and with the drafter; xPress plain, chain and auto with that drafter); "
        "xPress's default always runs in the dtype --dtype auto chooses here",
    )
    parser.add_argument("--drafts-of", type=int, help="show this prompt's drafts round by round in both engines")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    if not args.vllm_python:
        parser.error("--vllm-python (or XPRESS_VLLM_PYTHON): the python of the venv vLLM is installed in")
    preset = find_preset(args.preset) if args.preset else None
    args.target = preset.target if preset else args.target
    args.default_drafter = preset.drafter if preset else EMBEDDED_DRAFTER
    result = compare(args)
    print(report(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
