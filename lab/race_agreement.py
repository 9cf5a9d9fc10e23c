"""Do the verdict and the Race agree? Held-out chats replayed through the app's reply function with Race on.

    OMP_NUM_THREADS=1 python -m lab.race_agreement [--chats 10] [--turns 2] [--data ../shared/data]

Loads the embedded preset as the app does (the dtype measured, the kernels built, the controller's costs), then for
``--chats`` held-out ``sgd_dev`` dialogues spread over the file sends their first ``--turns`` user turns one after the
other, at the app's default settings (Auto on) with Race on, through ``xpress_app.chat.run_chat``. For every reply
it prints the verdict's whole-reply and per-round speedups, the Race's measured one, both prefills, and whether the
app said they agree (within ``verdict.AGREEMENT``); then the count. The issue's goal: 9 of 10 on a quiet machine.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from xpress_app.chat import run_chat
from xpress_app.config import EMBEDDED_PRESET, AppConfig, default_presets
from xpress_app.models import ModelCache
from xpress_app.settings import DEFAULTS
from xpress_core import verdict
from xpress_core.data import DEFAULT_DATA, default_chat_indices, dev_dialogues


def replay(cache: ModelCache, messages: list[str]) -> list[bool]:
    """One chat, turn by turn; per reply, whether the verdict and the Race agreed (replies without a round skipped)."""
    history: list[dict] = []
    agreed = []
    for text in messages:
        last = list(run_chat(cache, text, history, replace(DEFAULTS, preset=EMBEDDED_PRESET, race=True)))[-1]
        history = last.history
        spec, plain = last.reply.result, last.reply.plain_result
        step_s = (plain.draft_s + plain.verify_s + plain.other_s) / max(1, plain.rounds)
        cost = verdict.reply_cost(last.reply.traces, step_s)
        if cost is None:
            print(f"  {spec.new_tokens} tokens, no drafting round: nothing to compare")
            continue
        ok = verdict.agreement(cost, spec, plain)[0]
        agreed.append(ok)
        print(
            f"  {spec.new_tokens:3d} tokens, prompt {last.reply.traces[0].cache_len:3d} | verdict: whole reply "
            f"x{cost.speedup:.2f}, rounds x{cost.rounds.speedup:.2f} | Race x{verdict.race_speedup(spec, plain):.2f} | "
            f"prefill {1000 * spec.prefill_s:.1f} / {1000 * plain.prefill_s:.1f} ms | {'agree' if ok else 'apart'}"
        )
    return agreed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=10)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    start = time.perf_counter()
    cache = ModelCache(AppConfig(presets=default_presets(), device="cpu"))
    loaded = cache.get(EMBEDDED_PRESET)
    print(f"loaded in {time.perf_counter() - start:.1f} s; {loaded.speculative.dtype_choice.reason}")
    dialogues = dev_dialogues(args.data)
    agreed = []
    for index in default_chat_indices(len(dialogues), args.chats):
        print(f"sgd_dev dialogue {index}:")
        agreed += replay(cache, [m["content"] for m in dialogues[index] if m["role"] == "user"][: args.turns])
    print(f"verdict and Race agree on {sum(agreed)} of {len(agreed)} replies")


if __name__ == "__main__":
    main()
