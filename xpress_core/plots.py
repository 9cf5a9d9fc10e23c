"""Plotly figures of the decoding trace: pure functions from ``RoundTrace`` events to ``go.Figure``.

The app streams them into ``gr.Plot`` panels and the benchmark can save them; nothing here imports Gradio or touches
a model. Token ids become text through a ``token_text`` callable the caller supplies (usually a memoised
``tokenizer.decode([id])``), so the figures stay independent of any tokenizer.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

import plotly.graph_objects as go

from .trace import MASKED, DenoiseStep, RoundTrace
from .verdict import STAGES, RoundCost, round_cost, setting_label

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


def two_panels(left_title: str, right_title: str, split: float) -> dict:
    """Layout of two side-by-side panels (x/y left, x2/y2 right); cheaper to build than ``make_subplots``."""
    gap = 0.08
    title_at = {
        "xref": "paper",
        "yref": "paper",
        "y": 1.0,
        "yanchor": "bottom",
        "showarrow": False,
        "font": {"size": 13},
    }
    return {
        "xaxis": {"domain": [0, split - gap / 2], "anchor": "y"},
        "yaxis": {"anchor": "x"},
        "xaxis2": {"domain": [split + gap / 2, 1], "anchor": "y2"},
        "yaxis2": {"anchor": "x2"},
        "annotations": [
            dict(text=left_title, x=(split - gap / 2) / 2, **title_at),
            dict(text=right_title, x=(1 + split + gap / 2) / 2, **title_at),
        ],
    }


# --- 1. Draft evolution --------------------------------------------------------------------------------------------

EVOLUTION_TITLE = "Draft evolution"


def evolution_message(trace: RoundTrace) -> go.Figure | None:
    """The panel for a round with no drafts to show (the prefill, a plain step, no drafter), else None."""
    if trace.index == 0:
        return message_figure(
            EVOLUTION_TITLE,
            "Round 0 is the prefill: the target reads the prompt and picks the "
            "first token itself. Drafting starts in round 1.",
        )
    if not trace.drafts and trace.setting[2] == 0:
        return message_figure(
            EVOLUTION_TITLE,
            f"Round {trace.index}: a plain step.<br>The controller expected drafting not to pay here,<br>"
            "so the target decoded one token on its own.",
        )
    if not trace.drafts:
        return message_figure(EVOLUTION_TITLE, "No drafter: plain decoding verifies one token per round.")
    return None


@dataclass(frozen=True)
class EvolutionView:
    """What the draft panel shows of one round at one denoise step."""

    trace: RoundTrace
    tokens: tuple[tuple[int, ...], ...]  # (K, <= L) the drafts at this step; MASKED where still masked
    confidence: tuple[tuple[float, ...], ...]
    noise_level: float | None  # the gaussian drafter's noise level at this step, else None
    shown: int  # 0-based denoise step shown
    last: int  # 0-based last denoise step
    length: int  # the longest draft's length: a tree's shorter paths leave cells empty
    accept_lens: tuple[int, ...]
    chosen: int  # the draft on the chosen path
    bonus: int | None  # the target's own token after the accepted path
    kind: str = "denoise"  # the shown step's kind: "denoise", a refinement "pass", or the grafted "tree" after passes
    # (draft, position) cells whose token this refinement pass changed, and the token each held before it
    changed: tuple[tuple[tuple[int, int], int], ...] = ()

    @property
    def verified(self) -> bool:
        """After the last step the drafts are what the verifier saw: accepted / rejected cells get frames."""
        return self.shown == self.last


def evolution_view(trace: RoundTrace, step: int | None) -> EvolutionView:
    states = list(trace.steps)
    if not states:  # a drafter that reports no intermediate steps: show its final drafts, confidence unknown
        states = [DenoiseStep(trace.drafts, tuple(tuple(1.0 for _ in row) for row in trace.drafts))]
    last = len(states) - 1
    shown = last if step is None else min(max(step, 0), last)
    tokens = states[shown].tokens
    accept_lens = trace.draft_accept_lens or (0,) * len(tokens)
    return EvolutionView(
        trace=trace,
        tokens=tokens,
        confidence=states[shown].confidence,
        noise_level=states[shown].noise_level,
        shown=shown,
        last=last,
        length=max(len(row) for row in tokens),
        accept_lens=accept_lens,
        chosen=accept_lens.index(max(accept_lens)),
        bonus=trace.emitted[len(trace.accepted)] if len(trace.emitted) > len(trace.accepted) else None,
        kind=states[shown].kind,
        changed=pass_changes(states, shown),
    )


def pass_changes(states: list[DenoiseStep], shown: int) -> tuple[tuple[tuple[int, int], int], ...]:
    """The cells a refinement pass changed against the pass before, with their old tokens (none for pass 0, a
    denoise step, or a draft tree built after the passes, whose rows are other drafts)."""
    if shown == 0 or states[shown].kind != "pass" or states[shown - 1].kind != "pass":
        return ()
    before, now = states[shown - 1].tokens, states[shown].tokens
    return tuple(
        ((k, j), old)
        for k, (row_before, row_now) in enumerate(zip(before, now))
        for j, (old, new) in enumerate(zip(row_before, row_now))
        if old != new
    )


@dataclass(frozen=True)
class EvolutionCell:
    z: float | None  # confidence of a committed cell
    masked: int | None  # 1 for a masked cell
    text: str
    masked_text: str
    hover: str


EMPTY_CELL = EvolutionCell(None, None, "", "", "")  # no value and no text (a None text would print "null")


def evolution_cell(view: EvolutionView, token_text: TokenText, k: int, j: int) -> EvolutionCell:
    """One grid cell: draft ``k``, position ``j``."""
    where = f"draft {k + 1} · position {j + 1}"
    if j >= len(view.tokens[k]):
        return EMPTY_CELL
    token = view.tokens[k][j]
    if token == MASKED:
        return EvolutionCell(None, 1, "", "MASK", f"{where}<br>still masked")
    note = ""
    if view.verified and j < view.accept_lens[k]:
        note = "<br>accepted by the target"
    elif view.verified and j == view.accept_lens[k]:
        note = "<br>first rejected"
        if view.bonus is not None and k == view.chosen:
            note += f": the target chose {visible_text(repr(token_text(view.bonus)))}"
    was = dict(view.changed).get((k, j))
    if was is not None:
        note += f"<br>changed by this pass (was {visible_text(repr(token_text(was)))})"
    token_kind = "token" if view.noise_level is None else f"nearest token at noise t={view.noise_level:.2f}:"
    confidence = view.confidence[k][j]
    hover = (
        f"{where}<br>{token_kind} {visible_text(repr(token_text(token)))} (id {token})"
        f"<br>confidence {confidence:.2f}{note}"
    )
    return EvolutionCell(confidence, None, cell_label(token_text(token)), "", hover)


def evolution_heatmaps(view: EvolutionView, token_text: TokenText) -> list[go.Heatmap]:
    """Two layers: grey masked cells below, confidence-coloured committed cells above (each labels its own cells)."""
    k_drafts = len(view.tokens)
    grid = [[evolution_cell(view, token_text, k, j) for j in range(view.length)] for k in range(k_drafts)]
    rows = [
        f"<b>★ draft {k + 1}</b>" if view.verified and k == view.chosen else f"draft {k + 1}" for k in range(k_drafts)
    ]
    cols = [str(j + 1) for j in range(view.length)]
    hover = [[cell.hover for cell in row] for row in grid]
    masked = go.Heatmap(
        z=[[cell.masked for cell in row] for row in grid],
        x=cols,
        y=rows,
        colorscale=[[0, MASK_COLOUR], [1, MASK_COLOUR]],
        showscale=False,
        text=[[cell.masked_text for cell in row] for row in grid],
        texttemplate="%{text}",
        customdata=hover,
        hovertemplate="%{customdata}<extra></extra>",
        xgap=2,
        ygap=2,
        name="masked",
    )
    drafts = go.Heatmap(
        z=[[cell.z for cell in row] for row in grid],
        x=cols,
        y=rows,
        zmin=0.0,
        zmax=1.0,
        colorscale=CONFIDENCE_SCALE,
        colorbar={"title": "confidence", "thickness": 12},
        text=[[cell.text for cell in row] for row in grid],
        texttemplate="%{text}",
        textfont={"family": FONT},
        customdata=hover,
        hovertemplate="%{customdata}<extra></extra>",
        xgap=2,
        ygap=2,
        name="drafts",
    )
    return [masked, drafts]


def verdict_frames(view: EvolutionView) -> list[dict]:
    """Green frames on each draft's accepted cells, red on its first rejected one (after the last step only); before
    that, on a refinement pass, blue frames on the cells the pass changed."""
    frames = [] if view.verified else [cell_frame(j, k, CHANGED_COLOUR, 3) for (k, j), _ in view.changed]
    if view.verified:
        for k in range(len(view.tokens)):
            width = 3 if k == view.chosen else 2
            frames += [cell_frame(j, k, ACCEPTED_COLOUR, width) for j in range(min(view.accept_lens[k], view.length))]
            if view.accept_lens[k] < len(view.tokens[k]):
                frames.append(cell_frame(view.accept_lens[k], k, REJECTED_COLOUR, width))
    return frames


def evolution_title(view: EvolutionView) -> str:
    trace = view.trace
    details = [setting_label(trace)]  # a second, smaller title line: the panel sits in half the page's width
    if view.noise_level is not None:
        details.append(f"nearest tokens from noise t={view.noise_level:.2f}")
    if view.verified:
        details.append(f"accepted {trace.accept_len} of {view.length} + 1 from the target")
    if view.kind == "tree":  # the T = 1 tree with the refined chain grafted on (drafters/diffusion.py)
        step = f"draft tree after {view.last - 1} refinement passes"
    elif view.kind == "pass":  # pass 0 is the drafter's own forward
        step = f"refinement pass {view.shown}/{view.last}" + (f" · {len(view.changed)} changed" if view.shown else "")
    else:
        step = f"denoise step {view.shown + 1}/{view.last + 1}"
    title = f"{EVOLUTION_TITLE} · round {trace.index} · {step}"
    return title + f"<br><sup>{' · '.join(details)}</sup>"


def draft_evolution_figure(trace: RoundTrace, token_text: TokenText, step: int | None = None) -> go.Figure:
    """K drafts x L positions after denoise step ``step`` (0-based; None = the last one) of one round.

    Cells show the token text coloured by the drafter's confidence; masked cells are grey. With the gaussian drafter
    no cell is masked: each shows its position's nearest token at that step's noise level. After the last step (the
    drafts as the verifier saw them) the cells on the accepted path get a green frame and each draft's first
    rejected token a red one.
    """
    message = evolution_message(trace)
    if message is not None:
        return message
    view = evolution_view(trace, step)
    k_drafts = len(view.tokens)
    fig = go.Figure(data=evolution_heatmaps(view, token_text))
    fig.update_layout(
        title=evolution_title(view),
        shapes=verdict_frames(view),
        # A tree can have dozens of paths: past a dozen rows they share the height a dozen would take (18 px at least).
        height=max(220, 90 + (42 * k_drafts if k_drafts <= 12 else max(18 * k_drafts, 504))),
        margin={"l": 20, "r": 20, "t": 64, "b": 40},
        xaxis={"title": "position in block", "type": "category", "side": "bottom"},
        yaxis={"type": "category", "autorange": "reversed"},
        plot_bgcolor="white",
    )
    return fig


def cell_frame(col: int, row: int, colour: str, width: int) -> dict:
    """A frame around one categorical heatmap cell (categories sit at integer coordinates)."""
    return {
        "type": "rect",
        "x0": col - 0.5,
        "x1": col + 0.5,
        "y0": row - 0.5,
        "y1": row + 0.5,
        "xref": "x",
        "yref": "y",
        "line": {"color": colour, "width": width},
        "fillcolor": "rgba(0,0,0,0)",
    }


# --- 2. Accepted length --------------------------------------------------------------------------------------------

ACCEPT_TITLE = "Accepted length per round"


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
                name="single drafts",
                marker={"color": DRAFT_COLOUR, "size": 6},
                hovertemplate="draft %{customdata}: %{y} accepted<extra></extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[t.accept_len for t in rounds],
            mode="lines+markers",
            name="accepted (chosen path)",
            line={"color": ACCEPTED_COLOUR, "width": 2},
            hovertemplate="round %{x}: %{y} accepted<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=tau,
            mode="lines",
            name="running τ (tokens per round)",
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
    layout = two_panels("per draft (dots) and the chosen path", "histogram", split=0.72)
    layout["xaxis"].update(title="round")
    layout["yaxis"].update(title="draft tokens accepted", rangemode="tozero")
    layout["xaxis2"].update(title="accepted length", dtick=1)
    layout["yaxis2"].update(title="rounds", rangemode="tozero")
    fig.update_layout(
        title=f"{ACCEPT_TITLE} · τ = {tau[-1]:.2f} tokens per round",
        height=330,
        margin={"l": 50, "r": 20, "t": 70, "b": 40},
        legend={"orientation": "h", "y": -0.25},
        **layout,
    )
    return fig


# --- 3. Latency ----------------------------------------------------------------------------------------------------

LATENCY_TITLE = "Latency"


def latency_figure(
    traces: Sequence[RoundTrace], plain: Sequence[RoundTrace] = (), plain_step_s: float | None = None
) -> go.Figure:
    """Where the time went, and tokens/s so far (beside plain decoding if it ran).

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
        left, x_title, y_title, title = "time per round (ms)", "round (0 = prefill)", "ms", LATENCY_TITLE
    else:
        cost_per_round(fig, [t for t in traces if t.index > 0], cost)
        left, x_title, y_title = "cost per round", "drafting round", "plain steps · tokens"
        title = f"{LATENCY_TITLE} · τ {cost.tau:.2f} / {cost.plain_steps:.2f} plain steps a round → {cost.speedup:.2f}×"
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
                line={"color": colour, "width": 2},
                hovertemplate=f"{name}: %{{y:.1f}} tokens/s after %{{x}} tokens<extra></extra>",
            )
        )
    speeds = f"tokens/s: {traces[-1].tokens_per_s:.1f}"
    if plain and plain[-1].tokens_per_s > 0:
        speeds += f" (plain {plain[-1].tokens_per_s:.1f})"
    layout = two_panels(left, speeds, split=0.6)
    layout["xaxis"].update(title=x_title)
    layout["yaxis"].update(title=y_title, rangemode="tozero")
    layout["xaxis2"].update(title="tokens generated")
    layout["yaxis2"].update(rangemode="tozero")
    fig.update_layout(
        title=title,
        barmode="stack",
        height=330,
        margin={"l": 60, "r": 20, "t": 70, "b": 40},
        legend={"orientation": "h", "y": -0.25},
        **layout,
    )
    return fig


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
            name="tokens the round emitted",
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


# --- 4. Token provenance -------------------------------------------------------------------------------------------

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
