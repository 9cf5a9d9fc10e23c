"""Fitting the controller's stage costs (``controller.CostModel``) to stages timed by ``engine.calibrate``: the verify
forward in pieces, drafting per unit of the work the drafter declares, stages timed in turns."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from .controller import CostModel, RoundSetting


def fitted_costs(drafter, verify_s: dict[int, float], draft_s: dict[RoundSetting, float], other_s: float) -> CostModel:
    """The ``CostModel`` of timed verify forwards (by tokens drafted), timed drafts and a round's acceptance and
    commit: the verify in pieces (``fit_verify_costs``), drafting per unit of the work the drafter declares
    (``fit_draft_costs``)."""
    forward_s, token_s, step_s, wide_from, wide_token_s = fit_verify_costs(verify_s)
    per_unit = fit_draft_costs(round_draft_work(drafter), draft_s) if draft_s else (0.0,) * 3
    return CostModel(
        *per_unit[:2],
        forward_s,
        token_s,
        other_s,
        step_s,
        verify_wide=wide_from,
        verify_wide_token_s=wide_token_s,
        draft_work=drafter.draft_work,
        pass_s=per_unit[2],
        refine_passes=drafter.refine_passes,
    )


def round_draft_work(drafter) -> Callable[[RoundSetting], tuple[int, int, int]]:
    """A round's drafting work at (K, T, L) as the drafter declares it: (forwards, positions, refinement passes)."""
    return lambda setting: (*drafter.draft_work(setting), drafter.refine_passes(setting))


def fit_verify_costs(seconds: dict[int, float]) -> tuple[float, float, float, int, float]:
    """(fixed, per token, step, wide, per token past wide) seconds of a verify forward from its seconds over a root
    alone and over a short and a wide chain of drafted tokens (keys: tokens drafted, 0 and two more), and maybe a
    widest one: the tokens' share from the two chains, the step from one token up to a forward over drafts from the
    short one (``CostModel.verify_draft_s``), the share past the wide chain from the widest (0, 0 without it:
    ``CostModel.verify_wide``). A root alone costs fixed + one token's share, so a plain step is priced exactly as
    timed, and every chain timed is priced as timed."""
    points = sorted(seconds.items())
    (_, one), (short, few), (wide, many) = points[:3]
    token_s = max(0.0, (many - few) / (wide - short)) if wide > short else max(0.0, (few - one) / short)
    fitted = (max(0.0, one - token_s), token_s, max(0.0, few - one - token_s * short))
    if len(points) < 4:
        return (*fitted, 0, 0.0)
    widest, most = points[3]
    return (*fitted, wide, max(0.0, (most - many) / (widest - wide)))


def timed_in_turns(clock, stages: dict, repeats: int) -> dict:
    """Median seconds of each stage ``(run, setup or None)``: every turn runs each stage once, right after its setup,
    so that a drift of the machine's speed shifts every stage alike; the first turn warms up and is not counted.
    ``clock``: an ``engine.Clock`` (its ``now``)."""
    times: dict = {name: [] for name in stages}
    for turn in range(repeats + 1):
        for name, (run, setup) in stages.items():
            if setup:
                setup()
            start = clock.now()
            run()
            if turn:
                times[name].append(clock.now() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def calibration_drafts(block: int) -> tuple[RoundSetting, ...]:
    """Drafts whose declared (forwards, positions) tell the two draft costs apart for every drafter family: a short
    and a long block, two steps (a masked drafter's first step runs one row), four rows."""
    half, steps = max(1, block // 2), min(2, block)  # T <= L
    return (
        RoundSetting(1, 1, half),
        RoundSetting(1, 1, block),
        RoundSetting(1, steps, block),
        RoundSetting(4, steps, block),
    )


def fit_draft_costs(work: Callable[[RoundSetting], tuple[int, ...]], seconds: dict[RoundSetting, float]) -> tuple:
    """Seconds per unit of each kind of drafting work (per forward, per position, per refinement pass...): the
    least-squares fit of ``seconds`` to the drafts' declared work, no cost below zero (a column the drafts never do,
    or whose fit goes negative, costs zero and the others are fitted without it)."""
    rows = torch.tensor([work(s) for s in seconds], dtype=torch.float64)
    times = torch.tensor(list(seconds.values()), dtype=torch.float64)[:, None]
    kept = [c for c in range(rows.shape[1]) if rows[:, c].any()]
    while kept:
        fitted = torch.linalg.lstsq(rows[:, kept], times).solution[:, 0].tolist()
        if min(fitted) >= 0:
            break
        kept.pop(fitted.index(min(fitted)))  # the most negative: the work that explains the least
    costs = [0.0] * rows.shape[1]
    for column, cost in zip(kept, fitted if kept else []):
        costs[column] = cost
    return tuple(costs)
