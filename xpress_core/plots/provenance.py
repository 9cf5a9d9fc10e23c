"""4. The provenance panel: the reply as text, each token coloured by where it came from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from ..trace import RoundTrace
from .common import (
    FONT,
    FROM_DRAFT,
    FROM_TARGET,
    PROVENANCE_COLOURS,
    WRAP_CHARS,
    TokenText,
    message_figure,
    visible_text,
)

PROVENANCE_TITLE = "Token provenance"


@dataclass(frozen=True)
class TokenOrigin:
    token: int
    round: int
    source: str  # FROM_DRAFT or FROM_TARGET


def token_provenance(traces: Sequence[RoundTrace]) -> list[TokenOrigin]:
    """Each output token with where it came from: a round emits its accepted draft tokens, then the target's own."""
    return [
        TokenOrigin(token, t.index, FROM_DRAFT if i < t.accept_len else FROM_TARGET)
        for t in traces
        for i, token in enumerate(t.emitted)
    ]


def provenance_figure(traces: Sequence[RoundTrace], token_text: TokenText) -> go.Figure:
    """The reply as wrapped text, each token a box coloured by its origin (shade alternates with the round)."""
    origins = token_provenance(traces)
    if not origins:
        return message_figure(PROVENANCE_TITLE, "No tokens yet.", height=160)
    boxes = {FROM_DRAFT: [], FROM_TARGET: []}  # source -> [(line, start, width, label, colour, hover)]
    line, column = 0, 0
    for origin in origins:
        raw = token_text(origin.token)
        label = visible_text(raw)
        width = max(1, len(raw.replace("\n", "⏎")))
        if column and column + width > WRAP_CHARS:
            line, column = line + 1, 0
        colour = PROVENANCE_COLOURS[origin.source][origin.round % 2]
        hover = f"{visible_text(repr(raw))} (id {origin.token})<br>round {origin.round}: {origin.source}"
        boxes[origin.source].append((line, column, width, label, colour, hover))
        column += width
        if "\n" in raw:
            line, column = line + 1, 0
    fig = go.Figure()
    for source, items in boxes.items():
        if not items:
            continue
        lines, starts, widths, labels, colours, hovers = zip(*items)
        fig.add_trace(
            go.Bar(
                orientation="h",
                y=list(lines),
                base=list(starts),
                x=list(widths),
                text=list(labels),
                textposition="inside",
                insidetextanchor="middle",
                textangle=0,
                textfont={"family": FONT, "color": "black"},
                marker={"color": list(colours), "line": {"color": "white", "width": 1}},
                name=source,
                customdata=list(hovers),
                hovertemplate="%{customdata}<extra></extra>",
                width=0.9,
            )
        )
    drafted = sum(o.source == FROM_DRAFT for o in origins)
    fig.update_layout(
        title=f"{PROVENANCE_TITLE} · {drafted} of {len(origins)} tokens came from accepted drafts",
        barmode="overlay",
        height=110 + 26 * (line + 1),
        margin={"l": 20, "r": 20, "t": 50, "b": 20},
        uniformtext={"minsize": 9, "mode": "show"},
        plot_bgcolor="white",
        legend={"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"},
        xaxis={"visible": False, "range": [0, WRAP_CHARS]},
        yaxis={"visible": False, "autorange": "reversed"},
    )
    return fig
