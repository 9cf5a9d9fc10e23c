"""The figures the page shows before anything was decoded or measured; the panels' figures themselves are
``xpress_core.plots``' and ``xpress_core.bench.figures``'."""

from __future__ import annotations

from xpress_core import plots
from xpress_core.bench.figures import HEATMAP_METRICS


def empty_panels() -> dict[str, object]:
    """The Chat tab's four panels before the first reply, by View field name."""
    return {
        "evolution": plots.message_figure(plots.EVOLUTION_TITLE, "The drafts of each round appear here."),
        "accept": plots.message_figure(plots.ACCEPT_TITLE, "Accepted lengths appear here."),
        "latency": plots.message_figure(plots.LATENCY_TITLE, "Timings appear here."),
        "provenance": plots.message_figure(plots.PROVENANCE_TITLE, "The reply's tokens appear here.", height=160),
    }


def empty_heatmaps() -> dict[str, object]:
    """The Sweep tab's two heatmaps before the first sweep, by metric."""
    return {
        "tokens_per_s": plots.message_figure(
            HEATMAP_METRICS["tokens_per_s"], "Run a sweep: tokens/s over (K, T) appear here."
        ),
        "tau": plots.message_figure(HEATMAP_METRICS["tau"], "Run a sweep: τ over (K, T) appears here."),
    }
