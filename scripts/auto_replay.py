"""auto against plain decoding, replayed at fixed prices: the controller's variants compared without the machine's noise.

    OMP_NUM_THREADS=1 python -m scripts.auto_replay --costs /tmp/costs.json [--plain-charge 0.85 --draft-charge 1.03]
        [--sets sgd_dev,sgd_short,stories] [--temperatures 0,0.7] [--set FIRST_PROBE=4 --set REALISED_PRIOR=1e12]

Each request is decoded for real with ``auto`` (so the acceptance is real), then every round is charged a fixed price
instead of its measured time: a plain round ``--plain-charge`` times the calibrated plain step, a drafting round
``--draft-charge`` times its calibrated price (decoding paid 0.83-0.93x and 0.97-1.08x on this CPU in fp32: lab log,
"auto never below plain"). Plain decoding is charged the same plain round per token, so the ratio printed per class
and temperature is auto's tokens per second over plain decoding's at those prices. The calibrated prices are written to
``--costs`` on the first run and read back after, so that variants are replayed at the same prices. ``--set`` changes
one of the controller's constants (``controller.py``) for the run. Losses by kind (in plain steps over the class): the
request's first drafting round (priors only), probes (after a run of plain rounds) and the other drafting rounds.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from xpress_core import controller, engine
from xpress_core.config import DecodeConfig
from xpress_core.controller import PLAIN_STEP, CostModel, RoundSetting
from xpress_core.data import evaluation_prompts, prompt_class
from xpress_core.models import load_models
from xpress_core.trace import RoundTrace

PRICES = (
    "draft_forward_s",
    "draft_position_s",
    "verify_forward_s",
    "verify_token_s",
    "other_s",
    "verify_draft_s",
    "verify_wide",
    "verify_wide_token_s",
    "pass_s",
    "draft_other_s",
)


def fixed_prices(models, path: Path) -> CostModel:
    """The calibrated prices, written to ``path`` the first time and read back from it after (over a fresh
    calibration all the same: it carries the drafter's declared work, which a file of numbers cannot)."""
    calibrated = engine.calibrate(models)
    if path.exists():
        return replace(calibrated, **json.loads(path.read_text()))
    path.write_text(json.dumps({name: getattr(calibrated, name) for name in PRICES}))
    return calibrated


def replay(models, costs: CostModel, prompt, cfg: DecodeConfig, plain_s: float, draft_charge: float) -> dict:
    """One request's charged seconds, tokens and losses by kind (plain steps)."""
    charged, tokens, losses, first, plain_run = 0.0, 0, {}, True, 0
    for event in engine.decode(models, prompt, cfg, costs=costs):
        if not isinstance(event, RoundTrace) or event.index == 0:
            continue
        setting = RoundSetting(*event.setting)
        seconds = plain_s if setting.plain else draft_charge * costs.round_s(setting)
        charged, tokens = charged + seconds, tokens + len(event.emitted)
        if setting.plain:
            plain_run += 1
            continue
        kind = "first" if first else "probe" if plain_run >= controller.FIRST_PROBE else "other"
        losses[kind] = losses.get(kind, 0.0) + seconds / plain_s - len(event.emitted)
        first, plain_run = False, 0
    return {"charged": charged, "tokens": tokens, "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--costs", type=Path, required=True)
    parser.add_argument("--plain-charge", type=float, default=0.85)
    parser.add_argument("--draft-charge", type=float, default=1.03)
    parser.add_argument("--sets", default="sgd_dev,sgd_short,stories")
    parser.add_argument("--temperatures", default="0,0.7")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per prompt when sampling")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    for change in args.set:
        name, value = change.split("=")
        setattr(controller, name, type(getattr(controller, name))(float(value)))
    torch.set_num_threads(1)
    models = load_models(dtype="float32", device="cpu")
    costs = fixed_prices(models, args.costs)
    plain_s = args.plain_charge * costs.round_s(PLAIN_STEP)
    totals: dict = {}
    for temperature in (float(t) for t in args.temperatures.split(",")):
        for prompt in evaluation_prompts(args.sets.split(",")):
            ids = prompt.ids(models.tokenizer, max_new_tokens=args.max_new_tokens)
            for seed in range(args.seeds if temperature else 1):
                cfg = DecodeConfig(auto=True, max_new_tokens=args.max_new_tokens, temperature=temperature, seed=seed)
                one = replay(models, costs, ids, cfg, plain_s, args.draft_charge)
                total = totals.setdefault((prompt_class(prompt.name), temperature), {"charged": 0.0, "tokens": 0})
                total["charged"] += one["charged"]
                total["tokens"] += one["tokens"]
                for kind, loss in one["losses"].items():
                    total[kind] = total.get(kind, 0.0) + loss
    for (name, temperature), total in totals.items():
        losses = ", ".join(f"{k} {v:+.1f}" for k, v in total.items() if k not in ("charged", "tokens"))
        ratio = total["tokens"] * plain_s / total["charged"]
        print(f"{name} at {temperature}: auto over plain {ratio:.3f} (plain steps lost: {losses})")


if __name__ == "__main__":
    main()
