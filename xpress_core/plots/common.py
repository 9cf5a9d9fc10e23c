"""What the panels share: colours, token text made safe for Plotly, the empty panel, and the stacked layout of the
accepted-length and latency panels."""

from __future__ import annotations

import html
from collections.abc import Callable

import plotly.graph_objects as go

TokenText = Callable[[int], str]

# Provenance classes of an emitted token (docs/DESIGN.md §2.4): a draft token the target accepted, or the target's own
# draw (the bonus token after the accepted path, and the prefill's first token).
FROM_DRAFT = "accepted draft token"
FROM_TARGET = "target's own token"

CONFIDENCE_SCALE = "YlGnBu"
MASK_COLOUR = "#d9d9d9"
ACCEPTED_COLOUR = "#2ca02c"
CHANGED_COLOUR = "#1f77b4"  # a cell a refinement pass changed
REJECTED_COLOUR = "#d62728"
DRAFT_COLOUR = "#b0b0b0"
STAGE_COLOURS = {"draft": "#ff7f0e", "verify": "#1f77b4", "other": "#7f7f7f"}
SPECULATIVE_COLOUR = "#2ca02c"
PLAIN_COLOUR = "#7f7f7f"
# Alternating shades per round make round boundaries visible in the provenance text.
PROVENANCE_COLOURS = {FROM_DRAFT: ("#74c476", "#a1d99b"), FROM_TARGET: ("#6baed6", "#9ecae1")}

CELL_CHARS = 6  # a grid cell shows at most this many characters of its token
WRAP_CHARS = 64  # provenance text wraps after this many characters per line
FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"


def visible_text(text: str) -> str:
    """Token text made visible in a figure: newlines/tabs as symbols, Plotly's pseudo-HTML escaped."""
    return html.escape(text.replace("\n", "⏎").replace("\t", "⇥"), quote=False)


def cell_label(text: str) -> str:
    shown = text.replace(" ", "␣")
    return visible_text(shown if len(shown) <= CELL_CHARS else shown[: CELL_CHARS - 1] + "…")


def message_figure(title: str, message: str, height: int = 260) -> go.Figure:
    """An empty panel that says why there is nothing to draw."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 14})
    fig.update_layout(
        title=title,
        height=height,
        xaxis={"visible": False},
        yaxis={"visible": False},
        margin={"l": 20, "r": 20, "t": 50, "b": 20},
    )
    return fig


# The accepted-length and latency panels sit side by side in the app, in half the page's width (all of it on a phone).
PANEL_HEIGHT = 540
# Top: a one-line title, then the legend in one row (two on a phone, growing upwards under the title).
PANEL_MARGIN = {"l": 60, "r": 20, "t": 76, "b": 48}
AXIS_GAP = 48  # px under a plot for its tick labels and axis title
SUBTITLE_GAP = 24  # px for the title of the lower plot


def panel_title(text: str) -> dict:
    """A title of one line at the panel's top left, over the plots' left edge: short enough for a phone's width."""
    return {"text": text, "x": 0, "xref": "paper", "xanchor": "left", "y": 1 - 6 / PANEL_HEIGHT, "yanchor": "top"}


def stacked_panels(title: str, lower_title: str | None, upper_share: float = 0.7) -> dict:
    """Layout of a large plot (x/y) above a small one (x2/y2), the legend in a row between the title and the plots.

    Stacked rather than side by side, so both plots keep the panel's whole width in a half-width column and on a phone;
    the gaps are fixed in pixels, sized for the tick labels, axis titles and the lower plot's title, so no text reaches
    into a plot and the plots take most of the panel's height (the browser tests measure it).
    """
    region = PANEL_HEIGHT - PANEL_MARGIN["t"] - PANEL_MARGIN["b"]
    gap = AXIS_GAP + (SUBTITLE_GAP if lower_title else 0)
    lower = (region - gap) * (1 - upper_share)
    annotations = []
    if lower_title:
        annotations.append(
            {
                "text": lower_title,
                "x": 0,
                "xref": "paper",
                "xanchor": "left",
                "y": lower / region,
                "yref": "paper",
                "yanchor": "bottom",
                "showarrow": False,
                "font": {"size": 13},
            }
        )
    return {
        "title": panel_title(title),
        "height": PANEL_HEIGHT,
        "margin": PANEL_MARGIN,
        "xaxis": {"anchor": "y", "automargin": False},
        "yaxis": {"anchor": "x", "domain": [(lower + gap) / region, 1], "automargin": False},
        "xaxis2": {"anchor": "y2", "automargin": False},
        "yaxis2": {"anchor": "x2", "domain": [0, lower / region], "automargin": False},
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 1, "yanchor": "bottom", "font": {"size": 12}},
        # Plotly's tool bar appears over the panel's top right on hover: a few buttons, so it leaves the title alone.
        "modebar": {"remove": ["zoom", "pan", "select", "lasso", "zoomin", "zoomout", "autoscale"]},
        "annotations": annotations,
    }
