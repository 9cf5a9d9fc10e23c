"""What a round would cost, in plain steps, with a larger target on this machine: would a bigger embedded pair speed up?

    OMP_NUM_THREADS=1 python -m lab.target_scale [--sizes ours,w384,w512,w512x12,w768] [--repeats 40]

Random-weight Llama targets of growing width and depth (our tokenizer's 4,096-token vocabulary), in bf16 with their
linear layers packed as the engine packs them (``xpress_core/packing.py``), after a 200-token prompt: a plain step
(one token), a verify forward over a chain of 9 tokens (one draft of 8) and over 33 tokens with a float tree mask (a
draft tree of 32 nodes). A drafter of the target's width (ours shares the target's embedding and LM head) is stood
in for by a 2-layer model of the same shapes over 9 tokens: on the embedded pair it costs 0.52-0.54 plain steps
where the real drafter costs 0.44-0.51 (``lab.profile_round``). Every forward is timed by this thread's CPU time,
the four taken in turns, medians printed. The speedup columns put the embedded pair's accepted lengths (tau 3.6 for
the tree, 3.1 for the chain) over each size's round, with 0.05 plain steps of the engine's own work, and say what
tau 2.5x would need.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from xpress_core.packing import pack_linears

# name: (hidden, MLP, layers); 64-dimensional heads, half as many key/value heads (as the embedded target has)
SHAPES = {
    "ours": (256, 640, 6),
    "w384": (384, 1024, 8),
    "w512": (512, 1376, 8),
    "w512x12": (512, 1376, 12),
    "w768": (768, 2048, 12),
}
PAST = 200
TREE_TAU, CHAIN_TAU, OTHER = 3.6, 3.1, 0.05


def packed_llama(hidden: int, mlp: int, layers: int) -> LlamaForCausalLM:
    heads = hidden // 64
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        vocab_size=4096,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval().requires_grad_(False)
    pack_linears(model)
    return model


def forward_timer(model, tokens: int, tree_mask: bool):
    """A function timing one forward over ``tokens`` new tokens after the prompt (a fresh copy of its cache each time)."""
    prompt_cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.randint(10, 4000, (1, PAST)), cache=prompt_cache, use_cache=True)
    ids = torch.randint(10, 4000, (1, tokens))
    positions = torch.arange(PAST, PAST + tokens)[None]
    mask = None
    if tree_mask:  # additive, in the model's dtype, as the engine's verify passes it
        mask = torch.zeros(1, 1, tokens, PAST + tokens, dtype=torch.bfloat16)
        future = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
        mask[0, 0, :, PAST:].masked_fill_(future, torch.finfo(torch.bfloat16).min)

    def timed() -> float:
        cache = copy.deepcopy(prompt_cache)
        start = time.thread_time()
        with torch.inference_mode():
            model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=cache, use_cache=True)
        return time.thread_time() - start

    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    print(
        "size | params | plain step ms | verify 9 / 33 tokens, draft (plain steps) | speedup tree / chain | tau for 2.5x"
    )
    for name in args.sizes.split(","):
        hidden, mlp, layers = SHAPES[name]
        target, drafter = packed_llama(hidden, mlp, layers), packed_llama(hidden, mlp, 2)
        timers = {
            "plain": forward_timer(target, 1, False),
            "chain": forward_timer(target, 9, False),
            "tree": forward_timer(target, 33, True),
            "draft": forward_timer(drafter, 9, False),
        }
        seconds = {key: [] for key in timers}
        for _ in range(args.repeats):
            for key, timed in timers.items():
                seconds[key].append(timed())
        step = statistics.median(seconds["plain"])
        cost = {key: statistics.median(v) / step for key, v in seconds.items()}
        tree_round = cost["tree"] + cost["draft"] + OTHER
        chain_round = cost["chain"] + cost["draft"] + OTHER
        params = sum(p.numel() for p in target.parameters()) / 1e6
        print(
            f"{name} | {params:.1f} M | {step * 1e3:.1f} | {cost['chain']:.2f} / {cost['tree']:.2f}, {cost['draft']:.2f}"
            f" | {TREE_TAU / tree_round:.2f}x / {CHAIN_TAU / chain_round:.2f}x | {2.5 * tree_round:.2f} / "
            f"{2.5 * chain_round:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
