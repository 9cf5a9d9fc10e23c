"""The drafter's learning curve: tau on held-out chats against what the run has seen, from its own log.

``train drafter`` measures, at every evaluation, greedy tau at (K, T, L) = (1, 1, 8) on held-out ``sgd_dev`` chats
and the share of rounds that accepted at least j draft tokens (``train_log.jsonl``, one JSON record a line). A run
continued with ``--init`` writes a new log: pass the logs in training order and the curve goes on where the last
one stopped (steps, rows and wall time add up).
"""

from __future__ import annotations

import json
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots


def curve_points(logs: list[Path], seq_len: int) -> list[dict]:
    """The evaluation records of the logs, chained: each log's rows, tokens and wall time start where the last
    one ended. ``seq_len``: tokens per distilled row (the target reads each row once per step)."""
    points: list[dict] = []
    rows_before = wall_before = 0.0
    for log in logs:
        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        # A run resumed at an evaluation step evaluates it again: keep that step once.
        evals = list({r["step"]: r for r in records if "tau" in r}.values())
        for r in evals:
            rows = rows_before + r["rows_seen"]
            points.append(
                {
                    "tokens_seen": int(rows * seq_len),
                    "wall_min": round((wall_before + r["elapsed_s"]) / 60, 2),
                    "tau": r["tau"],
                    "accepted_at": r["accepted_at"],
                }
            )
        if evals:
            rows_before += evals[-1]["rows_seen"]
            wall_before += evals[-1]["elapsed_s"]
    return points


def learning_curve_figure(runs: dict[str, list[dict]], before_tau: float | None = None) -> go.Figure:
    """Left: tau of each run against target tokens read (wall minutes on hover); right: per-position acceptance at
    each run's last evaluation (and the first run's first). ``before_tau``: the drafter to beat, as a dashed line."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("τ at (K, T, L) = (1, 1, 8), held-out chats", "rounds accepting ≥ j drafts")
    )
    for name, points in runs.items():
        fig.add_scatter(
            x=[p["tokens_seen"] / 1e6 for p in points],
            y=[p["tau"] for p in points],
            customdata=[p["wall_min"] for p in points],
            hovertemplate="%{x:.2f}M tokens, %{customdata} min: τ %{y:.2f}<extra></extra>",
            mode="lines+markers",
            name=name,
            row=1,
            col=1,
        )
    if before_tau is not None:
        fig.add_hline(y=before_tau, line_dash="dash", annotation_text=f"before: τ {before_tau:.2f}", row=1, col=1)
    bars = [(f"{name}, last ({points[-1]['wall_min']} min)", points[-1]) for name, points in runs.items() if points]
    first = next((name, points[0]) for name, points in runs.items() if points) if bars else None
    for label, point in ([(f"{first[0]}, first ({first[1]['wall_min']} min)", first[1])] if first else []) + bars:
        shares = point["accepted_at"]
        fig.add_bar(x=list(range(1, len(shares) + 1)), y=shares, name=label, row=1, col=2)
    fig.update_xaxes(title_text="target tokens read in the run (millions)", row=1, col=1)
    fig.update_xaxes(title_text="block position j", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="τ (tokens per round)", row=1, col=1)
    fig.update_yaxes(title_text="share of rounds", range=[0, 1], row=1, col=2)
    fig.update_layout(template="plotly_white", barmode="group", width=1100, height=420)
    return fig


def parse_run(spec: str) -> tuple[str, list[Path]]:
    """``NAME=LOG[,LOG...]`` (logs of one run in training order) or a bare ``LOG`` named after its folder."""
    name, _, logs = spec.rpartition("=")
    paths = [Path(p) for p in logs.split(",")]
    return name or paths[0].parent.name, paths
