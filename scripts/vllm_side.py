"""vLLM's half of ``scripts/serve_vllm.py``; runs in vLLM's own venv (it imports nothing of xPress).

    VLLM_TARGET_DEVICE=cpu python scripts/vllm_side.py JOB.json OUT.json

JOB: the target and drafter folders, the prompts as token ids, max_new_tokens, the block (num_speculative_tokens),
and the concurrencies to time. OUT, for vLLM plain and with the drafter: the greedy outputs of the prompts one at a
time, tokens/s per concurrency, and for the drafter its acceptance counters (rounds, accepted tokens per round and
per position) over the one-at-a-time greedy run and the drafts it proposed there, prompt by prompt, round by round.
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


def counters(llm) -> dict:
    """vLLM's speculative-decoding counters so far (cumulative; the caller takes differences)."""
    found = {"rounds": 0, "accepted": 0, "per_position": []}
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_drafts":
            found["rounds"] = metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            found["accepted"] = metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            found["per_position"] = list(metric.values)
    return found


def generate(llm, prompts: list[list[int]], new: int) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def tokens_per_s(llm, prompts: list[list[int]], new: int, concurrency: int) -> float:
    """As xPress's side measures it: the prompts one at a time (1), else ``concurrency`` requests at once (the prompts
    cycled), after one warm-up request."""
    generate(llm, prompts[:1], new)
    started = time.perf_counter()
    if concurrency == 1:
        tokens = sum(len(generate(llm, [p], new)[0]) for p in prompts)
    else:
        tokens = sum(map(len, generate(llm, [prompts[i % len(prompts)] for i in range(concurrency)], new)))
    return tokens / (time.perf_counter() - started)


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
    result["tokens_per_s"] = {str(c): round(tokens_per_s(llm, prompts, new, c), 1) for c in job["concurrency"]}
    return result


def main() -> None:
    import vllm

    job = json.loads(Path(sys.argv[1]).read_text())
    out = {"version": vllm.__version__, "plain": one_engine(job, False), "spec": one_engine(job, True)}
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":  # vLLM's engine core may start in a spawned process, which re-imports this file
    main()
