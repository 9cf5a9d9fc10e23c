"""Plotly figures of the decoding trace: pure functions from ``RoundTrace`` events to ``go.Figure``, one module per
panel.

The app streams them into ``gr.Plot`` panels and the benchmark can save them; nothing here imports Gradio or touches
a model. Token ids become text through a ``token_text`` callable the caller supplies (usually a memoised
``tokenizer.decode([id])``), so the figures stay independent of any tokenizer.
"""

from .accept import ACCEPT_TITLE, accept_length_figure, running_tau
from .common import (
    ACCEPTED_COLOUR,
    FROM_DRAFT,
    FROM_TARGET,
    REJECTED_COLOUR,
    WRAP_CHARS,
    TokenText,
    cell_label,
    message_figure,
    visible_text,
)
from .evolution import EVOLUTION_TITLE, MAX_ROWS, draft_evolution_figure
from .latency import LATENCY_TITLE, latency_figure
from .provenance import PROVENANCE_TITLE, provenance_figure, token_provenance

__all__ = [
    "ACCEPTED_COLOUR",
    "ACCEPT_TITLE",
    "EVOLUTION_TITLE",
    "FROM_DRAFT",
    "FROM_TARGET",
    "LATENCY_TITLE",
    "MAX_ROWS",
    "PROVENANCE_TITLE",
    "REJECTED_COLOUR",
    "WRAP_CHARS",
    "TokenText",
    "accept_length_figure",
    "cell_label",
    "draft_evolution_figure",
    "latency_figure",
    "message_figure",
    "provenance_figure",
    "running_tau",
    "token_provenance",
    "visible_text",
]
