"""2. The accepted-length panel: accepted tokens per round and how often each length occurred."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import plotly.graph_objects as go

from ..trace import RoundTrace
from .common import ACCEPTED_COLOUR, DRAFT_COLOUR, message_figure, stacked_panels

ACCEPT_TITLE = "Accepted length"


def running_tau(traces: Sequence[RoundTrace]) -> list[float]:
    """tau after each drafting round: tokens emitted per round so far (accepted + the target's own token)."""
    totals = accumulate(t.accept_len + 1 for t in traces)
    return [total / n for n, total in enumerate(totals, start=1)]


def accept_length_figure(traces: Sequence[RoundTrace]) -> go.Figure:
    """Per round: each draft's accepted length (grey dots), the chosen path's (green) and running tau; a histogram."""
    rounds = [t for t in traces if t.index > 0]
    if not rounds:
        return message_figure(ACCEPT_TITLE, "No drafting round yet.")
    x = [t.index for t in rounds]
    dots = [
        (t.index + (k - (len(t.draft_accept_lens) - 1) / 2) * 0.6 / len(t.draft_accept_lens), n, k + 1)
        for t in rounds
        if len(t.draft_accept_lens) > 1
        for k, n in enumerate(t.draft_accept_lens)
    ]
    longest = max(len(d) for t in rounds for d in (t.drafts or ((),)))
    counts = [sum(t.accept_len == n for t in rounds) for n in range(longest + 1)]
    tau = running_tau(rounds)
    fig = go.Figure()
    if dots:  # spread the drafts' dots inside their round
        dot_x, dot_y, draft = zip(*dots)
        fig.add_trace(
            go.Scatter(
                x=dot_x,
                y=dot_y,
                customdata=draft,
                mode="markers",
                name="each draft",
                marker={"color": DRAFT_COLOUR, "size": 6},
                hovertemplate="draft %{customdata}: %{y} accepted<extra></extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[t.accept_len for t in rounds],
            mode="lines+markers",
            name="chosen path",
            line={"color": ACCEPTED_COLOUR, "width": 2},
            hovertemplate="round %{x}: %{y} accepted<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=tau,
            mode="lines",
            name="running τ",
            line={"color": "black", "dash": "dash"},
            hovertemplate="τ = %{y:.2f}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            x=list(range(longest + 1)),
            y=counts,
            xaxis="x2",
            yaxis="y2",
            marker_color=ACCEPTED_COLOUR,
            showlegend=False,
            hovertemplate="%{y} rounds accepted %{x}<extra></extra>",
        )
    )
    layout = stacked_panels(f"{ACCEPT_TITLE} · τ = {tau[-1]:.2f}", None)
    layout["xaxis"].update(title="round")
    layout["yaxis"].update(title="draft tokens accepted", rangemode="tozero")
    layout["xaxis2"].update(title="histogram of the accepted length", dtick=1)
    layout["yaxis2"].update(title="rounds", rangemode="tozero")
    fig.update_layout(**layout)
    return fig
