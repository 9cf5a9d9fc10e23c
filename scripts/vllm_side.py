"""vLLM's half of ``scripts/serve_vllm.py``; runs in vLLM's own venv (it imports nothing of xPress).

    VLLM_TARGET_DEVICE=cpu python scripts/vllm_side.py JOB.json OUT.json

JOB: the target and drafter folders, the prompts as token ids, max_new_tokens, the block (num_speculative_tokens),
the concurrencies to time and the threads to run on. OUT, for vLLM plain and with the drafter: the greedy outputs of
the prompts one at a time, tokens/s per concurrency, the timed one-at-a-time run's steps by vLLM's own request
metrics (decode seconds per step after each request's prefill) and, with the drafter, the seconds its proposer took
a round; for the drafter its acceptance counters (rounds, accepted tokens per round and per position) over the
one-at-a-time greedy run and the drafts it proposed there, prompt by prompt, round by round; the torch threads vLLM
ran on.

Threads: the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so vLLM's uniprocess executor,
which binds no OpenMP threads of its own: VLLM_CPU_OMP_THREADS_BIND applies to its multiprocess workers only), and
its CPU worker forbids ``torch.set_num_threads`` once it starts: the job's thread count is set before the engine is
built, as OMP_NUM_THREADS is by the caller.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def engine(job: dict, speculative: bool):
    from vllm import LLM

    spec = {"method": "dflash", "model": job["drafter"], "num_speculative_tokens": job["block"]}
    return LLM(
        model=job["target"],
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=1024,
        disable_log_stats=False,
        kv_cache_memory_bytes=1 << 30,  # else the CPU backend reserves 92 % of a memory node, and refuses a busy one
        speculative_config=spec if speculative else None,
    )


COUNTERS = {  # vLLM's metric -> our name; histograms give their sum of seconds
    "vllm:spec_decode_num_drafts": "rounds",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "vllm:generation_tokens": "tokens",
    "vllm:request_success": "requests",
    "vllm:request_decode_time_seconds": "decode_s",
    "vllm:request_prefill_time_seconds": "prefill_s",
}


def counters(llm) -> dict:
    """vLLM's counters so far (cumulative; the caller takes differences): speculative rounds and accepted tokens
    (per position too), new tokens, finished requests, and the requests' decode and prefill seconds."""
    found = {name: 0 for name in COUNTERS.values()} | {"per_position": []}
    for metric in llm.get_metrics():
        name = COUNTERS.get(metric.name)
        if metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            found["per_position"] = list(metric.values)
        elif name:  # summed over the labels a metric may carry (finish reasons, engines)
            found[name] += metric.sum if hasattr(metric, "sum") else metric.value
    return found


def generate(llm, prompts: list[list[int]], new: int) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


class ProposerClock:
    """Seconds spent in vLLM's DFlash proposer (its ``propose`` wrapped, the engine core being in this process)."""

    def __init__(self):
        from vllm.v1.spec_decode.dflash import DFlashProposer

        self.seconds, self.calls, original = 0.0, 0, DFlashProposer.propose

        def timed(proposer, *args, **kwargs):
            started = time.perf_counter()
            try:
                return original(proposer, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1

        DFlashProposer.propose = timed


def tokens_per_s(llm, prompts: list[list[int]], new: int, concurrency: int, proposer: ProposerClock | None) -> dict:
    """As xPress's side measures it: the prompts one at a time (1), else ``concurrency`` requests at once (the prompts
    cycled), after one warm-up request. One at a time, also the decode steps by vLLM's own request metrics: decode
    seconds (each request's first token to its last) per step after the prefill (a plain step, or with the drafter a
    round), and the proposer's seconds a round."""
    generate(llm, prompts[:1], new)
    before, proposed = counters(llm), (proposer.seconds if proposer else 0.0)
    started = time.perf_counter()
    if concurrency == 1:
        tokens = sum(len(generate(llm, [p], new)[0]) for p in prompts)
    else:
        tokens = sum(map(len, generate(llm, [prompts[i % len(prompts)] for i in range(concurrency)], new)))
    timing = {"tokens_per_s": round(tokens / (time.perf_counter() - started), 1)}
    if concurrency == 1:
        after = counters(llm)
        diff = {name: after[name] - before[name] for name in COUNTERS.values()}
        steps = diff["rounds"] if proposer else diff["tokens"] - diff["requests"]
        timing["decode_ms_per_step"] = round(1000 * diff["decode_s"] / max(steps, 1), 3)
        timing["prefill_ms"] = round(1000 * diff["prefill_s"] / max(diff["requests"], 1), 3)
        if proposer:
            timing["propose_ms_per_round"] = round(1000 * (proposer.seconds - proposed) / max(steps, 1), 3)
    return timing


def with_drafts(llm, prompt: list[int], new: int) -> tuple[list[int], list[list[int]]]:
    """One request's greedy output, and the drafts vLLM's DFlash proposer made for it round by round: its
    ``propose`` wrapped while the request runs (the engine core runs in this process: VLLM_ENABLE_V1_MULTIPROCESSING
    is 0). The last proposal, made after the request's last round, is never verified."""
    from vllm.v1.spec_decode.dflash import DFlashProposer

    drafts, original = [], DFlashProposer.propose

    def recording(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        drafts.append(out[0].tolist())
        return out

    DFlashProposer.propose = recording
    try:
        output = generate(llm, [prompt], new)[0]
    finally:
        DFlashProposer.propose = original
    return output, drafts


def one_engine(job: dict, speculative: bool) -> dict:
    import torch

    llm = engine(job, speculative)
    prompts, new = job["prompts"], job["max_new_tokens"]
    before = counters(llm)
    runs = [with_drafts(llm, p, new) if speculative else (generate(llm, [p], new)[0], []) for p in prompts]
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
    proposer = ProposerClock() if speculative else None
    timings = {str(c): tokens_per_s(llm, prompts, new, c, proposer) for c in job["concurrency"]}
    result["tokens_per_s"] = {c: t["tokens_per_s"] for c, t in timings.items()}
    result["steps"] = timings.get("1")
    result["threads"] = torch.get_num_threads()
    return result


def main() -> None:
    import torch

    job = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(job["threads"])  # before vLLM's CPU worker forbids it
    import vllm

    out = {"version": vllm.__version__, "plain": one_engine(job, False), "spec": one_engine(job, True)}
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":  # vLLM's engine core may start in a spawned process, which re-imports this file
    main()
