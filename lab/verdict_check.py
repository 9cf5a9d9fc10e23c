"""Is the app's verdict what a user would measure? Each reply's whole-reply speedup as the app states it, against an
independent timing of the same reply over the fastest plain decoding on this machine.

    python -m lab.verdict_check [--sets sgd_dev,small_talk] [--split held] [--chats 10] [--repeats 3]

Loads the embedded preset as the app does (the dtype ``--dtype auto`` chooses, the controller's costs) and sends the
first ``--chats`` chats of the sets' ``--split`` half through ``xpress_app.chat.run_chat`` at the app's defaults
(Race off), each its own conversation: the earlier turns as history, the last user turn as the message. It reads the
verdict's whole-reply figure from the line the app shows. Then, independently of the app's clock and plain-step
figures, it times in turns, ``--repeats`` times after a warm-up: the engine decoding the same prompt at the same
settings, the engine's own plain decoding (no drafter) and HF ``generate`` in float32 and in bfloat16 writing as
many tokens (greedy; ``generate`` with ``min_new_tokens`` = ``max_new_tokens`` = the reply's length, the engine's plain
decoding up to it, its time scaled to the reply's length where it stopped sooner), each by the wall clock from the
prompt's ids to the last token. The measured speedup is the fastest plain decoding's median over the engine's median.
Issue 48's goal: the verdict within 15 % of it.
Run it on a quiet machine, at the threads the app would use (the default).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from dataclasses import replace

import torch

from xpress_app.chat import run_chat
from xpress_app.config import EMBEDDED_PRESET, AppConfig, default_presets
from xpress_app.models import ModelCache
from xpress_app.settings import DEFAULTS, history_messages
from xpress_core.chat import cap_chars, fit_prompt
from xpress_core.data import evaluation_prompts, split_of
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import decode_to_end
from xpress_core.models import EMBEDDED_TARGET, NO_DRAFTER, context_limit, load_models

AGREEMENT = 0.15  # issue 48: the verdict within 15 % of an independent measurement
WHOLE_REPLY = re.compile(r"whole reply \(prefill \d+ ms included\): ([0-9.]+)×")


def conversation(prompt) -> tuple[list[dict], str]:
    """A shipped chat prompt as the app receives it: the earlier messages as history, the last user turn's text."""
    messages = [{"role": role, "content": content} for role, content in prompt.content]
    return messages[:-1], messages[-1]["content"]


def seconds(run) -> tuple[float, object]:
    """The run's wall-clock seconds and what it returned."""
    start = time.perf_counter()
    out = run()
    return time.perf_counter() - start, out


def independent_speedup(loaded, targets: dict, history: list[dict], text: str, tokens: int, repeats: int) -> dict:
    """The reply's tokens decoded again by the engine and by ``generate`` in each dtype, in turns (one warm-up)."""
    settings = replace(DEFAULTS, preset=EMBEDDED_PRESET, race=False)
    cfg = settings.decode_config()
    chat = cap_chars([*history_messages(history), {"role": "user", "content": text}])
    tokenizer = loaded.speculative.tokenizer
    limit = context_limit(loaded.speculative.target)
    ids = fit_prompt(tokenizer, chat.prompt, True, limit, cfg.max_new_tokens, chat.cuts).ids
    plain = replace(loaded.speculative, drafter=NoDrafter())
    plain_cfg = replace(cfg, max_new_tokens=tokens)
    runs = {
        "engine": lambda: decode_to_end(loaded.speculative, ids, cfg),
        "xpress plain": lambda: decode_to_end(plain, ids, plain_cfg),
    }
    for dtype, target in targets.items():
        runs[f"generate {dtype}"] = lambda target=target: target.generate(
            ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
        )
    timed: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for turn in range(repeats + 1):
            for name, run in runs.items():
                elapsed, out = seconds(run)
                if name == "xpress plain":  # stopped before the reply's length: timed per token, at that length
                    elapsed *= tokens / out.new_tokens
                if turn:
                    timed[name].append(elapsed)
    medians = {name: statistics.median(values) for name, values in timed.items()}
    fastest = min((name for name in medians if name != "engine"), key=medians.get)
    return {"medians_s": medians, "fastest_plain": fastest, "speedup": medians[fastest] / medians["engine"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="sgd_dev,small_talk", help="shipped chat prompt sets")
    parser.add_argument("--split", choices=["tune", "held", "all"], default="held")
    parser.add_argument("--chats", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cache = ModelCache(AppConfig(presets=default_presets(), device="cpu"))
    loaded = cache.get(EMBEDDED_PRESET)
    print(f"threads {torch.get_num_threads()}; {loaded.speculative.dtype_choice.reason}")
    targets = {
        dtype: load_models(EMBEDDED_TARGET, NO_DRAFTER, device="cpu", dtype=dtype).target
        for dtype in ("float32", "bfloat16")
    }
    prompts = [p for p in evaluation_prompts(args.sets.split(",")) if p.chat and args.split in ("all", split_of(p))][
        : args.chats
    ]
    agreed = 0
    for prompt in prompts:
        history, text = conversation(prompt)
        last = list(run_chat(cache, text, history, replace(DEFAULTS, preset=EMBEDDED_PRESET, race=False)))[-1]
        stated = WHOLE_REPLY.search(last.verdict or "")
        tokens = last.reply.result.new_tokens
        if stated is None:
            print(f"{prompt.name}: {tokens} tokens, no verdict (no drafting round)")
            continue
        measured = independent_speedup(loaded, targets, history, text, tokens, args.repeats)
        ratio = float(stated.group(1)) / measured["speedup"]
        agreed += abs(ratio - 1) <= AGREEMENT
        times = ", ".join(f"{name} {1000 * s:.1f} ms" for name, s in measured["medians_s"].items())
        print(
            f"{prompt.name}: {tokens} tokens | verdict x{float(stated.group(1)):.2f} | measured "
            f"x{measured['speedup']:.2f} over {measured['fastest_plain']} ({times}) | verdict/measured {ratio:.2f}"
        )
    print(f"the verdict within {AGREEMENT:.0%} of the measurement on {agreed} of {len(prompts)} replies")


if __name__ == "__main__":
    main()
