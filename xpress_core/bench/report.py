"""What a benchmark run writes: the goals' verdicts, the results table, and the JSON, CSV and HTML files."""

from __future__ import annotations

import argparse
import csv
import json
import platform
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ..config import REFINE_MODES, TREE
from ..data import prompt_class
from ..machine import cpu_identity
from ..models.dtypes import native_bf16
from ..records import json_record
from .measure import Measurement
from .methods import HF_ASSISTED, HF_LOOKUP, REFERENCE, XPRESS, XPRESS_AUTO, XPRESS_NONE, BenchModels
from .stages import Stage
from .summary import Summary, best_per_method, prompt_interval, repeat_rates, throughput

SCHEMA = "xpress-bench/1"


# The project's speed goals (embedded models, greedy): what the JSON's "goals" checks.
GOAL_SPEEDUP = 2.5  # best xPress over generate


GOAL_OVER_RIVALS = 1.5  # best xPress over the best assisted / prompt lookup setting


GOAL_ENGINE_SHARE = 0.9  # xpress-none tokens/s at least this share of generate's


GOAL_DRAFT_RATIO = 1.6  # drafting time per round, K=4 over K=1, parallel refinement


GOAL_AUTO_OVER_BEST_FIXED = 0.97  # xpress-auto tokens/s at least this share of the best fixed setting's (issue 48)


GOAL_AUTO_OVER_PLAIN = 1.0  # xpress-auto never slower than plain decoding (the engine's plain loop)


REFINEMENT_PAIR = (1, 4)  # the K values the drafting-time goal compares


PARALLEL = REFINE_MODES[0]


def goals(summaries: Sequence[Summary], grid: Sequence[Summary], calls: Sequence[Measurement] = ()) -> dict:
    """The speed goals at greedy, with the measured numbers behind each verdict: speedups from the final
    stage's ``summaries``, drafting time over K from the ``grid`` (every setting measured), and ``auto`` per prompt
    class and temperature from the final stage's ``calls``."""
    best = best_per_method(summaries, 0.0)
    out: dict = {}
    xp = best.get(XPRESS)
    ref = next((s for s in summaries if s.setting.is_reference and s.temperature == 0.0), None)
    fastest = best.get(REFERENCE)  # generate in its fastest dtype (the run's, or another the run measured)
    if fastest and ref and fastest is not ref:
        out["fastest_generate"] = {"dtype": fastest.setting.dtype, "over_run_dtype": fastest.speedup / ref.speedup}

    def over_fastest(summary: Summary) -> float:
        """Tokens/s over the faster generate's (as the speedup, which is over it repeat by repeat)."""
        return summary.tokens_per_s / fastest.tokens_per_s

    if xp and ref:
        out["best_xpress"] = {
            "setting": xp.setting.label,
            "speedup": xp.speedup,
            "over_fastest_generate": over_fastest(xp),
            "tau": xp.tau,
            "goal": GOAL_SPEEDUP,
            "met": min(xp.speedup or 0, over_fastest(xp)) >= GOAL_SPEEDUP,
        }
        for rival in (HF_ASSISTED, HF_LOOKUP):
            if rival in best:
                ratio = xp.tokens_per_s / best[rival].tokens_per_s
                out[f"xpress_over_{rival}"] = {
                    "rival_setting": best[rival].setting.label,
                    "ratio": ratio,
                    "goal": GOAL_OVER_RIVALS,
                    "met": ratio >= GOAL_OVER_RIVALS,
                }
    none = best.get(XPRESS_NONE)
    if none and ref:
        ratio = none.tokens_per_s / ref.tokens_per_s
        out["engine_overhead"] = {
            "xpress_none_over_generate": ratio,
            "goal": GOAL_ENGINE_SHARE,
            "met": ratio >= GOAL_ENGINE_SHARE,
        }
        if xp and none.verify_ms_per_round > 0 and xp.verify_ms_per_round > 0:
            # docs/DESIGN.md §5.1: a round costs at least one verify forward, so tau x t(AR step) / t(verify) bounds
            # the speedup over a plain loop whatever the drafter costs.
            out["speedup_limit"] = {
                "tau": xp.tau,
                "ar_step_ms": none.verify_ms_per_round,
                "verify_ms": xp.verify_ms_per_round,
                "limit": xp.tau * none.verify_ms_per_round / xp.verify_ms_per_round,
            }
    auto = best.get(XPRESS_AUTO)
    if auto and ref:
        out["auto"] = {
            "speedup": auto.speedup,
            "over_fastest_generate": over_fastest(auto),
            "tau": auto.tau,
            "goal": GOAL_SPEEDUP,
            "met": min(auto.speedup or 0, over_fastest(auto)) >= GOAL_SPEEDUP,
        }
        for name, rival, goal in (("best_fixed", xp, GOAL_AUTO_OVER_BEST_FIXED), ("plain", none, GOAL_AUTO_OVER_PLAIN)):
            if rival:
                ratio = auto.tokens_per_s / rival.tokens_per_s
                out[f"auto_over_{name}"] = {
                    "rival_setting": rival.setting.name,
                    "ratio": ratio,
                    "goal": goal,
                    "met": ratio >= goal,
                }
    out["refinement"] = refinement_ratios(grid)
    if calls:
        out["auto_per_class"] = auto_per_class(calls)
    return out


def auto_per_class(calls: Sequence[Measurement]) -> list[dict]:
    """``auto`` against plain decoding and against the fastest fixed xPress setting, per prompt class
    (``data.prompt_class``) and temperature: new tokens over seconds of that class's calls, all repeats together. A
    class where speculation does not pay is where a controller must not lose."""
    groups: dict[tuple[str, float], dict] = {}
    for m in calls:
        groups.setdefault((prompt_class(m.prompt), m.temperature), {}).setdefault(m.setting, []).append(m)
    rows = []
    for (group, temperature), by_setting in sorted(groups.items()):
        rates = {setting: throughput(ms) for setting, ms in by_setting.items()}
        auto_setting = next((s for s in rates if s.method == XPRESS_AUTO), None)
        if auto_setting is None:
            continue
        auto = rates[auto_setting]
        plain = next((s for s in rates if s.method == XPRESS_NONE), None)
        fixed = [(r, s) for s, r in rates.items() if s.method == XPRESS]
        row: dict = {
            "class": group,
            "temperature": temperature,
            "prompts": len({m.prompt for ms in by_setting.values() for m in ms}),
        }
        if plain:
            row["auto_over_plain"] = judged(
                auto / rates[plain], GOAL_AUTO_OVER_PLAIN, by_setting[auto_setting], by_setting[plain]
            )
        if fixed:
            rate, setting = max(fixed, key=lambda pair: pair[0])
            row["auto_over_best_fixed"] = {
                "rival_setting": setting.label,
                **judged(auto / rate, GOAL_AUTO_OVER_BEST_FIXED, by_setting[auto_setting], by_setting[setting]),
                "per_repeat": repeat_ratios(by_setting[auto_setting], by_setting[setting]),
            }
        rows.append(row)
    return rows


def judged(ratio: float, goal: float, calls: Sequence[Measurement], rival: Sequence[Measurement]) -> dict:
    """A class's ratio against its goal, with the interval the class's prompts put it in (``prompt_interval``):
    ``short`` only where the interval's top lies below the goal (met or not, the rest is within the noise)."""
    low, high = prompt_interval(calls, rival)
    return {"ratio": ratio, "goal": goal, "met": ratio >= goal, "interval": [low, high], "short": high < goal}


def repeat_ratios(calls: Sequence[Measurement], rival: Sequence[Measurement]) -> list[float]:
    """The ratio of two settings' rates repeat by repeat: how far one class's ratio moves between passes over the same
    prompts, the noise a shortfall of a few percent is read against."""
    mine, theirs = repeat_rates(calls), repeat_rates(rival)
    return [rate / theirs[r] for r, rate in mine.items() if r in theirs]


def refinement_ratios(summaries: Sequence[Summary]) -> list[dict]:
    """Drafting time per round at K=4 over K=1 for every other setting measured at both, greedy; K separate rows
    only (a draft tree refines one row whatever K)."""
    few, many = REFINEMENT_PAIR
    by_key = {
        (replace(s.setting.decode, drafts=0), s.setting.decode.drafts): s
        for s in summaries
        if s.setting.method == XPRESS and s.temperature == 0.0 and s.setting.decode.diversity != TREE
    }
    rows = []
    for (rest, drafts), one in by_key.items():
        other = by_key.get((rest, many))
        if drafts == few and other and one.draft_ms_per_round > 0:
            ratio = other.draft_ms_per_round / one.draft_ms_per_round
            goal = GOAL_DRAFT_RATIO if rest.refine == PARALLEL else None  # serial is expected near K x
            rows.append(
                {
                    "T": rest.steps,
                    "L": rest.block,
                    "refine": rest.refine,
                    "verify": rest.verify,
                    f"draft_ms_k{few}": one.draft_ms_per_round,
                    f"draft_ms_k{many}": other.draft_ms_per_round,
                    "ratio": ratio,
                    "goal": goal,
                    "met": None if goal is None else ratio <= goal,
                }
            )
    return rows


def machine_info(models: BenchModels) -> dict:
    import transformers

    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        # Which CPU, and whether it computes bf16 natively: the same models' costs differ by kind (SmolLM2's verify
        # over 9 tokens 1.5x a one-token forward in fp32 with AVX-512 BF16, 1.8x with AVX2 alone).
        "cpu": cpu_identity()["cpu"],
        "native_bf16": native_bf16(),
        "cpu_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(models.device),
        "dtype": str(models.target.dtype).removeprefix("torch."),
        "dtype_choice": models.dtype_choice.to_json() if models.dtype_choice else None,
    }
    if models.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(models.device)
    return info


def output_paths(json_path: Path, figure_names: Sequence[str]) -> dict[str, Path]:
    """Everything a run writes, named after the JSON: ``OUT.json``, ``OUT.csv``, ``OUT_table.md``, ``OUT_NAME.html``."""
    stem = json_path.with_suffix("")
    paths = {"json": json_path, "csv": stem.with_suffix(".csv"), "table": Path(f"{stem}_table.md")}
    return paths | {name: Path(f"{stem}_{name}.html") for name in figure_names}


def write_outputs(stages: Sequence[Stage], args: argparse.Namespace, models: BenchModels) -> dict[str, str]:
    """CSV of every measurement of every stage; JSON with the final stage's summaries (the headline), the grid's
    (the search stage's, or the final's when no search ran), goals, mismatches and the measurements; figures."""
    final, grid = stages[-1], stages[0]
    try:
        from .figures import bench_figures  # plotly is imported only when a run writes its figures
    except ImportError as missing:  # a GPU machine without plotly (scripts/device_run.py): the measurements still count
        figures, no_figures = {}, f"no figures: {missing}"
    else:
        figures, no_figures = bench_figures(final.run.summaries, grid.run.summaries), None
    paths = output_paths(args.json, list(figures))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"stage": st.name, **m.row()} for st in stages for m in st.run.measurements]
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for name, figure in figures.items():
        # plotly.js is written once beside the figures: they open offline and stay small.
        figure.write_html(paths[name], include_plotlyjs="directory")
    paths["table"].write_text(markdown_table(final.run.summaries, final.run.measurements) + "\n")
    files = {k: str(v) for k, v in paths.items()}
    document = {
        "schema": SCHEMA,
        "args": {k: v if isinstance(v, (int, float, bool, type(None))) else str(v) for k, v in vars(args).items()},
        "machine": machine_info(models),
        "auto_choice": chosen.to_json() if (chosen := models.costs and models.costs.chosen) else None,
        "models": {
            "target": args.target,
            "drafter": args.drafter,
            "ar_drafter": args.ar_drafter,
            "drafter_noise": getattr(models.drafter, "noise", None),
            "drafter_tree_sharpness": getattr(models.drafter, "tree_sharpness", None),  # greedy trees (DESIGN 2.2)
            "target_params": sum(p.numel() for p in models.target.parameters()),
        },
        "stages": [
            {
                "name": st.name,
                "prompts": [p.name for p in st.prompts],
                "plan": {**asdict(st.plan), "settings": [s.name for s in st.plan.settings]},
                "load": st.run.load and asdict(st.run.load),  # how busy the machine was (None: no load average)
            }
            for st in stages
        ],
        "summaries": [s.to_json() for s in final.run.summaries],
        "grid": [s.to_json() for s in grid.run.summaries],
        "best": {
            str(t): {m: s.setting.label for m, s in best_per_method(final.run.summaries, t).items()}
            for t in final.plan.temperatures
        },
        "goals": json_record(goals(final.run.summaries, grid.run.summaries, final.run.measurements)),
        "mismatches": [{"stage": st.name, **m.to_json()} for st in stages for m in st.run.mismatches],
        "skipped": [
            {"stage": st.name, "setting": name, "reason": why} for st in stages for name, why in st.run.skipped
        ],
        "measurements": rows,
        "files": files,
        "no_figures": no_figures,
    }
    paths["json"].write_text(json.dumps(document, indent=1, default=str))
    return files


def markdown_table(summaries: Sequence[Summary], calls: Sequence[Measurement] = ()) -> str:
    """``generate`` in every dtype measured and the best setting of every other method, at every temperature: what
    the README's Results table shows; with the ``calls``, ``auto`` per prompt class below it (``class_table``)."""
    lines = [
        (
            "| method | setting | temperature | tokens/s | speedup over the fastest generate | tau | prefill share "
            "| greedy/same-seed mismatches |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for temperature in sorted({s.temperature for s in summaries}):
        generate = [s for s in summaries if s.setting.method == REFERENCE and s.temperature == temperature]
        best = [s for method, s in best_per_method(summaries, temperature).items() if method != REFERENCE]
        for s in generate + best:
            speedup = "" if s.speedup is None else f"{s.speedup:.2f}x ({s.speedup_min:.2f}-{s.speedup_max:.2f})"
            checked = f"{s.mismatches}/{s.checked}" if s.checked else "n/a"
            lines.append(
                f"| {s.setting.method} | {s.setting.label or '-'} | {temperature:g} | {s.tokens_per_s:.1f} | "
                f"{speedup} | {s.tau:.2f} | {s.prefill_share:.0%} | {checked} |"
            )
    classes = auto_per_class(calls)
    return "\n".join(lines) + (f"\n\n{class_table(classes)}" if classes else "")


def class_table(rows: Sequence[dict]) -> str:
    """``auto_per_class`` as a table: each ratio with its 90 % interval over the class's prompts, and whether it meets
    its goal, falls short beyond that noise, or sits within it."""

    def cell(judged: dict | None) -> str:
        if judged is None:
            return "-"
        low, high = judged["interval"]
        verdict = "met" if judged["met"] else "short" if judged["short"] else "within noise"
        return f"{judged['ratio']:.3f} ({low:.2f}-{high:.2f}) {verdict}"

    lines = [
        "| auto, per class | temperature | prompts | over xPress plain (90 % interval) | over the fastest fixed | that setting |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        fixed = row.get("auto_over_best_fixed")
        lines.append(
            f"| {row['class']} | {row['temperature']:g} | {row['prompts']} | {cell(row.get('auto_over_plain'))} | "
            f"{cell(fixed)} | {fixed['rival_setting'] if fixed else '-'} |"
        )
    return "\n".join(lines)
