"""3. The latency panel: where each round's time went, and tokens/s so far."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from ..trace import RoundTrace
from ..verdict import STAGES, RoundCost, round_cost, setting_label
from .common import (
    ACCEPTED_COLOUR,
    PLAIN_COLOUR,
    SPECULATIVE_COLOUR,
    STAGE_COLOURS,
    message_figure,
    stacked_panels,
)

LATENCY_TITLE = "Latency"


def latency_figure(
    traces: Sequence[RoundTrace], plain: Sequence[RoundTrace] = (), plain_step_s: float | None = None
) -> go.Figure:
    """Where the time went (above), and tokens/s so far beside plain decoding's if it ran (below).

    With ``plain_step_s`` (one plain decoding step, measured) each drafting round's draft / verify / other time is
    drawn in plain steps beside the tokens it emitted, with the break-even line: a round pays when it emits more
    tokens than it costs plain steps (``verdict``). Without it, or before the first drafting round, the time of every
    round (0 = the prefill forward) in ms.
    """
    if not traces:
        return message_figure(LATENCY_TITLE, "No round yet.")
    cost = round_cost(traces, plain_step_s) if plain_step_s else None
    fig = go.Figure()
    if cost is None:
        stage_bars(fig, traces, 1000.0, "ms")
        x_title, y_title, title = "round (0 = prefill)", "ms", f"{LATENCY_TITLE} per round"
    else:
        rounds = [t for t in traces if t.index > 0]
        cost_per_round(fig, rounds, cost)
        x_title, y_title = "drafting round", "plain steps · tokens"
        title = f"{LATENCY_TITLE} · τ ÷ break-even = {cost.speedup:.2f}×"
    series = [("speculative", traces, SPECULATIVE_COLOUR)] + ([("plain", plain, PLAIN_COLOUR)] if plain else [])
    for name, run, colour in series:
        fig.add_trace(
            go.Scatter(
                x=[t.new_tokens_total for t in run],
                y=[t.tokens_per_s for t in run],
                xaxis="x2",
                yaxis="y2",
                mode="lines",
                name=f"{name} tokens/s",
                showlegend=False,  # the lower plot's title names the lines in their colours
                line={"color": colour, "width": 2},
                hovertemplate=f"{name}: %{{y:.1f}} tokens/s after %{{x}} tokens<extra></extra>",
            )
        )
    layout = stacked_panels(title, speeds_title(traces, plain))
    layout["xaxis"].update(title=x_title)
    layout["yaxis"].update(title=y_title, rangemode="tozero")
    layout["xaxis2"].update(title="tokens generated")
    layout["yaxis2"].update(title="tokens/s", rangemode="tozero")
    if cost is not None:
        # Headroom above the highest bar, diamond or line for the line labels, inside the plot.
        top = max(max(t.accept_len + 1, (t.draft_s + t.verify_s + t.other_s) / cost.plain_step_s) for t in rounds)
        layout["yaxis"].update(range=[0, 1.25 * max(top, cost.tau, cost.plain_steps)])
        layout["annotations"] += level_labels(cost)
    fig.update_layout(barmode="stack", **layout)
    return fig


def speeds_title(traces: Sequence[RoundTrace], plain: Sequence[RoundTrace]) -> str:
    """The lower plot's title, which also names its lines in their colours (no legend entries: one row of legend)."""
    speeds = f'tokens/s: <span style="color:{SPECULATIVE_COLOUR}">speculative {traces[-1].tokens_per_s:.1f}</span>'
    if plain and plain[-1].tokens_per_s > 0:
        speeds += f' · <span style="color:{PLAIN_COLOUR}">plain {plain[-1].tokens_per_s:.1f}</span>'
    return speeds


def level_labels(cost: RoundCost) -> list[dict]:
    """The τ and break-even lines labelled just above them, τ at the plot's right end and the break-even at its left,
    so the two labels never overlap however close the lines are (the y range leaves room above the higher one)."""
    return [
        {
            "text": text,
            "x": end,
            "xref": "x domain",
            "xanchor": "right" if end else "left",
            "y": level,
            "yref": "y",
            "yanchor": "bottom",
            "showarrow": False,
            "font": {"size": 12},
            "bgcolor": "rgba(255,255,255,0.7)",
        }
        for text, level, end in (
            (f"τ {cost.tau:.2f}", cost.tau, 1),
            (f"break-even {cost.plain_steps:.2f}", cost.plain_steps, 0),
        )
    ]


def cost_per_round(fig: go.Figure, rounds: Sequence[RoundTrace], cost: RoundCost) -> None:
    """Each drafting round's stages in plain steps beside the tokens it emitted, and the lines of τ and of the
    break-even τ (a round's mean cost)."""
    stage_bars(fig, rounds, 1 / cost.plain_step_s, "plain steps")
    x = [t.index for t in rounds]
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[t.accept_len + 1 for t in rounds],
            customdata=[setting_label(t) for t in rounds],
            mode="markers",
            name="tokens emitted",
            marker={"color": ACCEPTED_COLOUR, "size": 8, "symbol": "diamond"},
            hovertemplate="round %{x} (%{customdata}): %{y} tokens<extra></extra>",
        )
    )
    for name, level, dash in (
        (f"break-even τ {cost.plain_steps:.2f} (a round's mean cost)", cost.plain_steps, "dash"),
        (f"τ {cost.tau:.2f} (tokens per round)", cost.tau, "solid"),
    ):
        fig.add_trace(
            go.Scatter(
                x=[x[0] - 0.5, x[-1] + 0.5],
                y=[level, level],
                mode="lines",
                name=name,
                showlegend=False,  # labelled on the plot (level_labels)
                line={"color": "black", "dash": dash, "width": 1.5},
                hoverinfo="skip",
            )
        )


def stage_bars(fig: go.Figure, rounds: Sequence[RoundTrace], scale: float, unit: str) -> None:
    """Draft / verify / other of each round as stacked bars, seconds times ``scale`` in ``unit`` (hover: also ms)."""
    x = [t.index for t in rounds]
    in_ms = "" if unit == "ms" else " (%{customdata[1]:.2f} ms)"
    for stage in STAGES:
        seconds = [getattr(t, f"{stage}_s") for t in rounds]
        fig.add_trace(
            go.Bar(
                x=x,
                y=[s * scale for s in seconds],
                customdata=[(setting_label(t), 1000 * s) for t, s in zip(rounds, seconds)],
                name=stage,
                marker_color=STAGE_COLOURS[stage],
                hovertemplate=f"round %{{x}} (%{{customdata[0]}}): {stage} %{{y:.2f}} {unit}{in_ms}<extra></extra>",
            )
        )
