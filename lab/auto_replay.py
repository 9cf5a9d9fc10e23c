"""auto against plain decoding and fixed settings, replayed at fixed prices: the controller's variants compared without
the machine's noise.

    OMP_NUM_THREADS=1 python -m lab.auto_replay --costs /tmp/costs.json [--split tune] [--methods auto,auto-counts,
        4x1x8,1x1x8] [--sets sgd_dev,sgd_short,stories] [--temperatures 0,0.7] [--set GAIN_PRIOR=1.0] [--dtype bfloat16]
        [--preset smollm2]

Each request is decoded for real with each method (so the acceptance is real), then every round is charged a fixed
price instead of its measured time: a plain round ``--plain-charge`` times the calibrated plain step, a drafting round
``--draft-charge`` times its calibrated price (its draft, and the verify over the nodes it verified). Plain decoding is
charged the same plain round per token, so the ratio printed per class, temperature and method is its tokens per second
over plain decoding's at those prices. The calibrated prices are written to ``--costs`` on the first run and read back
after, so that variants are replayed at the same prices. ``--split`` keeps the prompts of one half (``data.split_of``:
constants are chosen on "tune" only; "held" is reported). Methods: ``auto`` (the setting chosen at load,
``controller.ChosenControl``), ``auto-counts`` (the counting model, ``AutoControl``), ``KxTxL`` a fixed setting.
``--set`` changes one of the controller's constants for the run. For ``auto`` it also prints how often it drafted and
verified, and the nodes it verified a round. ``--dtype``: the models' dtype, which the costs file should have been
calibrated in.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from xpress_core import controller, counting, engine
from xpress_core.config import DecodeConfig
from xpress_core.controller import PLAIN_STEP, CostModel, RoundSetting
from xpress_core.data import evaluation_prompts, prompt_class, split_of
from xpress_core.models import load_models
from xpress_core.presets import find_preset
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

# The modules whose constants ``--set`` changes (each module reads its own name for a constant).
CONTROL_MODULES = (controller, counting)


def holders(name: str) -> list:
    """The control modules that hold the constant ``name``."""
    found = [module for module in CONTROL_MODULES if hasattr(module, name)]
    if not name.isupper() or not found:
        raise SystemExit(f"{name}: not a constant of xpress_core/controller.py or counting.py")
    return found


def set_constant(name: str, value: float) -> None:
    """``name`` set to ``value`` (as the constant's own type) wherever a control module holds it."""
    for module in holders(name):
        setattr(module, name, type(getattr(module, name))(value))


def fixed_prices(models, path: Path) -> CostModel:
    """The calibrated prices, written to ``path`` the first time and read back from it after (over a fresh
    calibration all the same: it carries the drafter's declared work, which a file of numbers cannot)."""
    calibrated = engine.calibrate(models)
    if path.exists():
        return replace(calibrated, **json.loads(path.read_text()))
    path.write_text(json.dumps({name: getattr(calibrated, name) for name in PRICES}))
    return calibrated


class Watched:
    """``engine.control`` that keeps the control it makes."""

    def __init__(self, costs: CostModel, charges: tuple[float, float]):
        self.made = None
        self.original = engine.control
        self.costs, self.charges = costs, charges

    def __call__(self, *args, **kwargs):
        self.made = self.original(*args, **kwargs)
        return self.made


def charged(control, costs: CostModel, charges: tuple[float, float], setting: RoundSetting, nodes: int) -> tuple:
    """A round's charged seconds, (its draft, the rest): a plain round ``plain_charge`` times the calibrated plain
    step, a drafting round ``draft_charge`` times its calibrated draft (a chance control's drafted tree, else the
    round's ``setting``) and verify over the ``nodes`` it verified (none: a plain step's)."""
    plain_charge, draft_charge = charges
    plain_s = plain_charge * costs.round_s(PLAIN_STEP)
    drafted = not setting.plain
    draft_s = costs.drafting_s(setting) if drafted else 0.0
    if not drafted:
        return 0.0, plain_s
    return draft_charge * draft_s, draft_charge * costs.after_draft_s(nodes) if nodes else plain_s


def method_config(method: str, cfg: DecodeConfig) -> DecodeConfig:
    if method.startswith("auto"):
        return cfg
    k, t, length = (int(x) for x in method.split("x"))
    return replace(cfg, auto=False, drafts=k, steps=t, block=length)


def replay(models, costs: CostModel, prompt, cfg: DecodeConfig, charges: tuple[float, float], watched) -> dict:
    """One request's charged seconds, tokens, rounds and the chance control's figures."""
    out = {"charged": 0.0, "tokens": 0, "rounds": 0, "drafted": 0, "verified": 0, "nodes": 0}
    out["accepted"] = 0
    for event in engine.decode(models, prompt, cfg, costs=costs):
        if not isinstance(event, RoundTrace) or event.index == 0:
            continue
        setting, nodes = RoundSetting(*event.setting), max(0, len(event.tree_tokens) - 1)
        control = watched.made
        draft_s, rest_s = charged(control, costs, charges, setting, nodes)
        out["charged"] += draft_s + rest_s
        out["tokens"] += len(event.emitted)
        out["rounds"] += 1
        out["drafted"] += draft_s > 0.0
        out["verified"] += not setting.plain
        out["nodes"] += nodes
        out["accepted"] += len(event.accepted)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--costs", type=Path, required=True)
    parser.add_argument("--plain-charge", type=float, default=1.0)
    parser.add_argument("--draft-charge", type=float, default=1.0)
    parser.add_argument("--sets", default="sgd_dev,sgd_short,stories")
    parser.add_argument("--split", choices=("tune", "held", "all"), default="tune")
    parser.add_argument("--methods", default="auto,auto-counts,4x1x8,1x1x8")
    parser.add_argument("--temperatures", default="0,0.7")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per prompt when sampling")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--dtype", default="float32", help="the models' dtype (the costs file should be of the same)")
    parser.add_argument("--preset", help="a preset's target and drafter (e.g. smollm2) instead of the embedded pair")
    args = parser.parse_args()
    for change in args.set:
        name, value = change.split("=")
        set_constant(name, float(value))
    torch.set_num_threads(1)
    preset = find_preset(args.preset) if args.preset else None
    models = load_models(*((preset.target, preset.drafter) if preset else ()), dtype=args.dtype, device="cpu")
    costs = fixed_prices(models, args.costs)
    watched = Watched(costs, (args.plain_charge, args.draft_charge))
    engine.control = watched
    prompts = [p for p in evaluation_prompts(args.sets.split(",")) if args.split in ("all", split_of(p))]
    totals: dict = {}
    for method in args.methods.split(","):
        # The counting model is what auto ran before the chances: the same drafter, its trees' chances unread.
        chances = method != "auto-counts"
        run_models = replace(models, drafter=models.drafter)
        type(run_models.drafter).offers_chances = chances
        for temperature in (float(t) for t in args.temperatures.split(",")):
            for prompt in prompts:
                ids = prompt.ids(models.tokenizer, max_new_tokens=args.max_new_tokens)
                for seed in range(args.seeds if temperature else 1):
                    base = DecodeConfig(
                        auto=True, max_new_tokens=args.max_new_tokens, temperature=temperature, seed=seed
                    )
                    charges = (args.plain_charge, args.draft_charge)
                    one = replay(run_models, costs, ids, method_config(method, base), charges, watched)
                    key = (prompt_class(prompt.name), temperature, method)
                    total = totals.setdefault(key, dict.fromkeys(one, 0))
                    for name, value in one.items():
                        total[name] += value
        type(models.drafter).offers_chances = True
    plain_s = args.plain_charge * costs.round_s(PLAIN_STEP)
    print(f"split {args.split}: {len(prompts)} prompts; plain step {1000 * plain_s:.2f} ms")
    for (name, temperature, method), t in sorted(totals.items()):
        ratio = t["tokens"] * plain_s / t["charged"]
        extra = ""
        if method == "auto":
            nodes = t["nodes"] / max(1, t["verified"])
            extra = f", drafted {t['drafted']}/{t['rounds']} verified {t['verified']} ({nodes:.1f} nodes)"
        tau = t["tokens"] / t["rounds"]
        print(f"{name:11s} {temperature:.1f} {method:12s} over plain {ratio:.3f}  tokens/round {tau:.2f}{extra}")


if __name__ == "__main__":
    main()
