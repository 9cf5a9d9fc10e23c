"""Plotly figures of a benchmark run: pure functions from ``Summary`` rows to ``go.Figure``.

Used by the bench CLI (written as HTML) and by the app's Sweep tab (``heatmap``). Every method is shown at its best
setting (the fastest, at the temperature asked for), so each bar is what a user would get after tuning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .methods import REFERENCE, XPRESS
from .summary import Summary, best_per_method

HEATMAP_METRICS = {"tokens_per_s": "tokens/s", "tau": "τ (tokens per round)", "speedup": "speedup over generate"}
LATENCY_PARTS = ("prefill", "draft", "verify", "other")


def bench_figures(summaries: Sequence[Summary], grid: Sequence[Summary] | None = None) -> dict[str, go.Figure]:
    """Every figure the bench writes, by file-name suffix: methods compared on ``summaries``, heatmaps over the
    ``grid`` summaries (every xPress setting measured; default: ``summaries``)."""
    grid = summaries if grid is None else grid
    return {
        "speedup": speedup_figure(summaries),
        "tau_hist": tau_histogram(summaries),
        "latency": latency_breakdown(summaries),
        "heatmap_tokens_per_s": heatmap(grid, "tokens_per_s"),
        "heatmap_tau": heatmap(grid, "tau"),
    }


def speedup_figure(summaries: Sequence[Summary]) -> go.Figure:
    """Speedup of each method's best setting over ``generate``, per temperature; whiskers span the repeats."""
    fig = go.Figure()
    for temperature in sorted({s.temperature for s in summaries}):
        best = [s for s in best_per_method(summaries, temperature).values() if s.speedup is not None]
        fig.add_bar(
            name=f"temperature {temperature:g}",
            x=[s.setting.method for s in best],
            y=[s.speedup for s in best],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [s.speedup_max - s.speedup for s in best],
                "arrayminus": [s.speedup - s.speedup_min for s in best],
            },
            text=[f"{s.speedup:.2f}x" for s in best],
            customdata=[[s.setting.label or "-", s.tokens_per_s, s.tau] for s in best],
            hovertemplate="%{x} %{customdata[0]}<br>speedup %{y:.2f}x<br>%{customdata[1]:.1f} tokens/s"
            "<br>τ %{customdata[2]:.2f}<extra></extra>",
        )
    fig.add_hline(y=1.0, line_dash="dot", annotation_text=REFERENCE, annotation_position="top left")
    fig.update_layout(
        title="Speedup over transformers generate (best setting per method)",
        barmode="group",
        yaxis_title="speedup (x)",
        xaxis_title="method",
        template="plotly_white",
    )
    return fig


def tau_histogram(summaries: Sequence[Summary], temperature: float = 0.0) -> go.Figure:
    """Share of verify rounds by tokens emitted (accepted + the target's own), best setting per method."""
    fig = go.Figure()
    for s in best_per_method(summaries, temperature).values():
        rounds = sum(count for _, count in s.tau_hist) or 1  # tau_hist is sorted by length already
        fig.add_bar(
            name=s.setting.name,
            x=[n for n, _ in s.tau_hist],
            y=[count / rounds for _, count in s.tau_hist],
            hovertemplate="%{x} tokens: %{y:.1%} of rounds<extra></extra>",
        )
    fig.update_layout(
        title=f"Tokens per verify round (temperature {temperature:g})",
        barmode="group",
        xaxis_title="tokens emitted in a round",
        yaxis_title="share of rounds",
        yaxis_tickformat=".0%",
        xaxis_dtick=1,
        template="plotly_white",
    )
    return fig


def latency_breakdown(summaries: Sequence[Summary], temperature: float = 0.0) -> go.Figure:
    """Milliseconds per generated token split into prefill / draft / verify / other, best setting per method."""
    best = list(best_per_method(summaries, temperature).values())
    fig = go.Figure()
    for part in LATENCY_PARTS:
        fig.add_bar(
            name=part,
            x=[s.setting.name for s in best],
            y=[s.ms_per_token[part] for s in best],
            hovertemplate=f"{part}: %{{y:.3f}} ms/token<extra></extra>",
        )
    fig.update_layout(
        title=f"Where the time goes (temperature {temperature:g})",
        barmode="stack",
        yaxis_title="ms per generated token",
        template="plotly_white",
    )
    return fig


def heatmap(
    summaries: Sequence[Summary],
    metric: str,
    temperature: float = 0.0,
    refine: str | None = None,
    verify: str | None = None,
) -> go.Figure:
    """``metric`` of the xPress settings over (K, T), one panel per block length L.

    ``refine`` / ``verify`` pick the slice; left out, the most measured combination. Where the grid also varied
    schedule or diversity, a cell shows the fastest of its settings.
    """
    if metric not in HEATMAP_METRICS:
        raise ValueError(f"metric must be one of {', '.join(HEATMAP_METRICS)}, got {metric!r}")
    rows = [s for s in summaries if s.setting.method == XPRESS and s.temperature == temperature]
    modes = Counter((s.setting.decode.refine, s.setting.decode.verify) for s in rows)
    if rows and (refine is None or verify is None):
        common = modes.most_common(1)[0][0]
        refine, verify = refine or common[0], verify or common[1]
    rows = [s for s in rows if (s.setting.decode.refine, s.setting.decode.verify) == (refine, verify)]
    title = f"{HEATMAP_METRICS[metric]} over (K, T): {refine} refinement, {verify} verify, temperature {temperature:g}"
    if not rows:
        fig = go.Figure()
        fig.add_annotation(text="no xPress setting measured for this slice", showarrow=False)
        fig.update_layout(title=title, template="plotly_white")
        return fig
    cells: dict[tuple[int, int, int], Summary] = {}
    for s in rows:
        d = s.setting.decode
        key = (d.block, d.drafts, d.steps)
        if key not in cells or s.tokens_per_s > cells[key].tokens_per_s:
            cells[key] = s
    blocks = sorted({d for d, _, _ in cells})
    fig = make_subplots(rows=1, cols=len(blocks), subplot_titles=[f"L = {b}" for b in blocks], horizontal_spacing=0.08)
    values = [getattr(s, metric) for s in cells.values()]
    low, high = min(values), max(values)
    for col, block in enumerate(blocks, start=1):
        ks = sorted({k for b, k, _ in cells if b == block})
        ts = sorted({t for b, _, t in cells if b == block})
        z = [[getattr(cells[(block, k, t)], metric) if (block, k, t) in cells else None for t in ts] for k in ks]
        labels = [[cells[(block, k, t)].setting.label if (block, k, t) in cells else "" for t in ts] for k in ks]
        fig.add_trace(
            go.Heatmap(
                x=[str(t) for t in ts],
                y=[str(k) for k in ks],
                z=z,
                customdata=labels,
                zmin=low,
                zmax=high,
                coloraxis="coloraxis",
                texttemplate="%{z:.2f}",
                hovertemplate="%{customdata}<br>" + HEATMAP_METRICS[metric] + " %{z:.3f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="T (denoise steps)", type="category", row=1, col=col)
        fig.update_yaxes(title_text="K (drafts)" if col == 1 else None, type="category", row=1, col=col)
    fig.update_layout(
        title=title,
        coloraxis={"colorscale": "Viridis", "colorbar_title": HEATMAP_METRICS[metric]},
        template="plotly_white",
    )
    return fig
