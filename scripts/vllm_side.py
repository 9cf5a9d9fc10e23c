"""vLLM's half of ``scripts/serve_vllm.py``; runs in vLLM's own venv (it imports nothing of xPress).

    VLLM_TARGET_DEVICE=cpu python scripts/vllm_side.py JOB.json OUT.json

JOB: the target and drafter folders, vLLM's speculative method for that drafter (``dflash`` or ``draft_model``), the
prompts as token ids, max_new_tokens, the block (num_speculative_tokens), the concurrencies to time, the threads to
run on, the timed passes and the dtype. OUT, for vLLM plain, with the drafter and with n-gram speculation (the
engines built in this process, timed in turns one request at a time): the greedy outputs of the prompts one at a
time, tokens/s per concurrency, the timed one-at-a-time run's CPU ms a token, its busiest threads, and its steps by
the engine core's own timestamps of each request (decode seconds per step after its prefill) and, with the drafter,
the seconds its proposer took a round; for the drafter its acceptance counters (rounds, accepted tokens per round
and per position) over the one-at-a-time greedy run and the drafts it proposed there, prompt by prompt, round by
round; the torch threads vLLM ran on.

Threads: the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so vLLM's uniprocess executor,
which binds no OpenMP threads of its own: VLLM_CPU_OMP_THREADS_BIND applies to its multiprocess workers only), and
its CPU worker forbids ``torch.set_num_threads`` once it starts: the job's thread count is set before the engine is
built, as OMP_NUM_THREADS is by the caller.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def engine(job: dict, kind: str):
    """vLLM on the target: plain, with the drafter (``spec``), or with its n-gram speculation (``ngram``: the block's
    tokens looked up in the prompt and the reply so far, as its docs configure it)."""
    from vllm import LLM

    spec = {
        "plain": None,
        "spec": {
            "method": job.get("method", "dflash"),
            "model": job["drafter"],
            "num_speculative_tokens": job["block"],
        },
        "ngram": {"method": "ngram", "num_speculative_tokens": job["block"], "prompt_lookup_max": 4},
    }[kind]
    return LLM(
        model=job["target"],
        dtype=job.get("dtype", "float32"),
        enforce_eager=True,
        seed=0,
        max_model_len=1024,
        disable_log_stats=False,
        kv_cache_memory_bytes=1 << 30,  # else the CPU backend reserves 92 % of a memory node, and refuses a busy one
        speculative_config=spec,
    )


def counters(llm) -> dict:
    """vLLM's speculative-decoding counters so far (cumulative; the caller takes differences)."""
    found = {"rounds": 0, "accepted": 0, "per_position": []}
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_drafts":
            found["rounds"] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            found["accepted"] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            found["per_position"] = list(metric.values)
    return found


def requests(llm, prompts: list[list[int]], new: int) -> list:
    """vLLM's RequestOutputs of greedy requests (their ``metrics``: the engine core's timestamps of each request)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=False)
    return llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)


def generate(llm, prompts: list[list[int]], new: int) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in requests(llm, prompts, new)]


def proposer_class(method: str):
    """The class of vLLM's proposer for ``method``: its ``propose`` is what the clock and the draft recorder wrap."""
    if method == "draft_model":
        from vllm.v1.spec_decode.draft_model import DraftModelProposer

        return DraftModelProposer
    from vllm.v1.spec_decode.dflash import DFlashProposer

    return DFlashProposer


class ProposerClock:
    """Seconds spent in vLLM's proposer (its ``propose`` wrapped, the engine core being in this process)."""

    def __init__(self, method: str):
        proposer_type = proposer_class(method)
        self.seconds, self.calls, original = 0.0, 0, proposer_type.propose

        def timed(proposer, *args, **kwargs):
            started = time.perf_counter()
            try:
                return original(proposer, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1

        proposer_type.propose = timed


def batch_tokens_per_s(llm, prompts: list[list[int]], new: int, concurrency: int) -> float:
    """As xPress's side measures it: ``concurrency`` requests at once (the prompts cycled), after one warm-up
    request."""
    generate(llm, prompts[:1], new)
    started = time.perf_counter()
    tokens = sum(map(len, generate(llm, [prompts[i % len(prompts)] for i in range(concurrency)], new)))
    return round(tokens / (time.perf_counter() - started), 1)


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds so far of each thread of this process (Linux /proc), by "name/tid"."""
    found, tick = {}, os.sysconf("SC_CLK_TCK")
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue  # a thread that ended meanwhile
        found[f"{name}/{task.name}"] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return found


def busiest_threads(before: dict[str, float], wall_s: float, top: int = 3) -> dict[str, float]:
    """The threads that took the most CPU since ``before``, as a share of ``wall_s`` (1.0: a whole core)."""
    spent = {name: s - before.get(name, 0.0) for name, s in thread_cpu_s().items()}
    return {name: round(s / wall_s, 3) for name, s in sorted(spent.items(), key=lambda kv: -kv[1])[:top]}


def in_turns(engines: dict, prompts: list[list[int]], new: int, repeats: int, proposer: ProposerClock) -> dict:
    """The engines one request at a time, taking turns prompt by prompt (``repeats`` passes), after one warm-up
    request each, as xPress's side times its own: per engine new tokens per wall second and per CPU second of this
    process (all its threads; and the busiest threads' shares of a core over the whole timing), and by the engine
    core's own timestamps of each request the decode seconds (its first token to its last) per step after the
    prefill (a plain step, or with the drafter a round: vLLM's round counter, which only the drafter's engine
    moves), the prefill's (scheduled to first token), and the proposer's seconds a round. (vLLM's metrics registry
    is one per process: both engines' requests land in its histograms.)"""
    for llm in engines.values():
        generate(llm, prompts[:1], new)
    keys = ("tokens", "wall", "cpu", "proposer", "decode", "prefill", "requests", "rounds")
    spent = {name: dict.fromkeys(keys, 0.0) for name in engines}
    threads_before, started = thread_cpu_s(), time.perf_counter()
    for _ in range(repeats):
        for prompt in prompts:
            for name, llm in engines.items():
                mine, rounds = spent[name], counters(llm)["rounds"]
                wall, cpu, proposed = time.perf_counter(), time.process_time(), proposer.seconds
                (out,) = requests(llm, [prompt], new)
                mine["wall"] += time.perf_counter() - wall
                mine["cpu"] += time.process_time() - cpu
                mine["proposer"] += proposer.seconds - proposed
                mine["rounds"] += counters(llm)["rounds"] - rounds
                mine["tokens"] += len(out.outputs[0].token_ids)
                mine["decode"] += out.metrics.last_token_ts - out.metrics.first_token_ts
                mine["prefill"] += out.metrics.first_token_ts - out.metrics.scheduled_ts
                mine["requests"] += 1
    found = {"busiest_threads": busiest_threads(threads_before, time.perf_counter() - started)}
    for name, mine in spent.items():
        steps = mine["rounds"] or mine["tokens"] - mine["requests"]
        found[name] = {
            "tokens_per_s": round(mine["tokens"] / mine["wall"], 1),
            "cpu_ms_per_token": round(1000 * mine["cpu"] / mine["tokens"], 3),
            "decode_ms_per_step": round(1000 * mine["decode"] / max(steps, 1), 3),
            "prefill_ms": round(1000 * mine["prefill"] / mine["requests"], 3),
        }
        if name == "ngram":  # vLLM counts only the steps where a match drafted: its steps are not known
            found[name]["decode_ms_per_step"] = None
        if mine["rounds"] and name == "spec":  # the clock wraps the drafter's proposer only
            found[name]["propose_ms_per_round"] = round(1000 * mine["proposer"] / steps, 3)
    return found


def with_drafts(llm, prompt: list[int], new: int, method: str) -> tuple[list[int], list[list[int]]]:
    """One request's greedy output, and the drafts vLLM's proposer made for it round by round: its ``propose``
    wrapped while the request runs (the engine core runs in this process: VLLM_ENABLE_V1_MULTIPROCESSING is 0). The
    last proposal, made after the request's last round, is never verified."""
    proposer_type = proposer_class(method)
    drafts, original = [], proposer_type.propose

    def recording(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        drafts.append(out[0].tolist())
        return out

    proposer_type.propose = recording
    try:
        output = generate(llm, [prompt], new)[0]
    finally:
        proposer_type.propose = original
    return output, drafts


def outputs_and_drafts(llm, job: dict, kind: str) -> dict:
    """The prompts' greedy outputs one at a time; speculating, the acceptance counters over them, and with the drafter
    its drafts."""
    prompts, new = job["prompts"], job["max_new_tokens"]
    before = counters(llm)
    method, speculative = job.get("method", "dflash"), kind != "plain"
    runs = [with_drafts(llm, p, new, method) if kind == "spec" else (generate(llm, [p], new)[0], []) for p in prompts]
    after = counters(llm)
    result = {"outputs": [output for output, _ in runs], "drafts": [drafts for _, drafts in runs]}
    if speculative:
        rounds = after["rounds"] - before["rounds"]
        per_pos = [a - b for a, b in zip(after["per_position"], before["per_position"] or [0] * job["block"])]
        result |= {
            "rounds": rounds,
            "accepted_per_round": round((after["accepted"] - before["accepted"]) / max(rounds, 1), 4),
            "accepted_per_position": [round(x / max(rounds, 1), 4) for x in per_pos],
        }
    return result


def both_engines(job: dict) -> dict:
    """vLLM plain and with the drafter, then with n-gram speculation, all built in this process: their outputs, then
    their timings. vLLM's metrics registry is one per process and holds the counters of the engine built last, so the
    n-gram engine is built once the drafter's counters were read, and timed in turns with plain decoding again."""
    engines = {kind: engine(job, kind) for kind in ("plain", "spec")}
    found = {name: outputs_and_drafts(llm, job, name) for name, llm in engines.items()}
    proposer = ProposerClock(job.get("method", "dflash"))
    timings(engines, job, proposer, found)
    engines["ngram"] = engine(job, "ngram")
    found["ngram"] = outputs_and_drafts(engines["ngram"], job, "ngram")
    timings({"plain": engines["plain"], "ngram": engines["ngram"]}, job, proposer, found, keep=("ngram",))
    return found


def timings(engines: dict, job: dict, proposer: ProposerClock, found: dict, keep: tuple = ("plain", "spec")) -> None:
    """The engines timed one request at a time in turns, and at each further concurrency; into ``found`` for ``keep``."""
    import torch

    prompts, new = job["prompts"], job["max_new_tokens"]
    one = in_turns(engines, prompts, new, job["repeats"], proposer) if 1 in job["concurrency"] else {}
    for name in keep:
        llm = engines[name]
        speed = {str(c): batch_tokens_per_s(llm, prompts, new, c) for c in job["concurrency"] if c != 1}
        found[name] |= {"steps": one.get(name), "threads": torch.get_num_threads()}
        found[name]["busiest_threads"] = one.get("busiest_threads")
        found[name]["tokens_per_s"] = {"1": one[name]["tokens_per_s"]} | speed if one else speed


def main() -> None:
    import torch

    job = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(job["threads"])  # before vLLM's CPU worker forbids it
    import vllm

    out = {"version": vllm.__version__, **both_engines(job)}
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":  # vLLM's engine core may start in a spawned process, which re-imports this file
    main()
