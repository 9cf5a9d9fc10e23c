"""1. The draft panel: K drafts x L positions of one round at one denoise step."""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from ..trace import MASKED, DenoiseStep, RoundTrace
from ..verdict import setting_label
from .common import (
    ACCEPTED_COLOUR,
    CHANGED_COLOUR,
    CONFIDENCE_SCALE,
    FONT,
    MASK_COLOUR,
    REJECTED_COLOUR,
    TokenText,
    cell_label,
    message_figure,
    visible_text,
)

EVOLUTION_TITLE = "Draft evolution"
# Rows the panel shows at most: a tree of K=4 · T=3 has 16 paths, and all of them would push the round and step sliders
# under the panel below a 1280x720 first screen. The chosen path always shows, then the longest accepted others.
MAX_ROWS = 5
ROW_PX = 42


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
    rows: tuple[int, ...]  # the drafts shown, in order (at most MAX_ROWS; the chosen one always)
    bonus: int | None  # the target's own token after the accepted path
    kind: str = "denoise"  # the shown step's kind: "denoise", a refinement "pass", or a draft "tree" after p passes
    # (draft, position) cells whose token this refinement pass changed, and the token each held before it (None: a
    # node new in a refined tree)
    changed: tuple[tuple[tuple[int, int], int | None], ...] = ()

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
    tokens, confidence = states[shown].tokens, states[shown].confidence
    accept_lens = trace.draft_accept_lens or (0,) * len(tokens)
    chosen = accept_lens.index(max(accept_lens))
    return EvolutionView(
        trace=trace,
        tokens=tokens,
        confidence=confidence,
        noise_level=states[shown].noise_level,
        shown=shown,
        last=last,
        length=max(len(row) for row in tokens),
        accept_lens=accept_lens,
        chosen=chosen,
        rows=shown_rows(len(tokens), accept_lens, chosen),
        bonus=trace.emitted[len(trace.accepted)] if len(trace.emitted) > len(trace.accepted) else None,
        kind=states[shown].kind,
        changed=pass_changes(states, shown),
    )


def shown_rows(count: int, accept_lens: tuple[int, ...], chosen: int) -> tuple[int, ...]:
    """The ``count`` drafts of a step the panel shows, in their own order: all of them, or past MAX_ROWS the chosen one
    and the others the target accepted most of (the same rows at every step with the round's drafts, so scrubbing
    the steps keeps them). A step before a tree was built has other rows than the tree's paths: its first ones."""
    if count <= MAX_ROWS:
        return tuple(range(count))
    if count != len(accept_lens):
        return tuple(range(MAX_ROWS))
    others = sorted((k for k in range(count) if k != chosen), key=lambda k: (-accept_lens[k], k))
    return tuple(sorted([chosen, *others[: MAX_ROWS - 1]]))


def pass_changes(states: list[DenoiseStep], shown: int) -> tuple[tuple[tuple[int, int], int | None], ...]:
    """The cells a refinement pass changed against the pass before, with their old tokens; for a refined tree, the
    cells whose node (its path) the tree before did not hold, with None (its rows are other paths). None for pass
    0 or a denoise step."""
    kind = states[shown].kind
    if shown == 0 or kind not in ("pass", "tree") or states[shown - 1].kind != kind:
        return ()
    before, now = states[shown - 1].tokens, states[shown].tokens
    if kind == "tree":
        held = {path[: j + 1] for path in before for j in range(len(path))}
        return tuple(
            ((k, j), None) for k, path in enumerate(now) for j in range(len(path)) if path[: j + 1] not in held
        )
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
    changed = dict(view.changed)
    if changed.get((k, j)) is not None:
        note += f"<br>changed by this pass (was {visible_text(repr(token_text(changed[(k, j)])))})"
    elif (k, j) in changed:
        note += "<br>new in this pass's tree"
    token_kind = "token" if view.noise_level is None else f"nearest token at noise t={view.noise_level:.2f}:"
    confidence = view.confidence[k][j]
    hover = (
        f"{where}<br>{token_kind} {visible_text(repr(token_text(token)))} (id {token})"
        f"<br>confidence {confidence:.2f}{note}"
    )
    return EvolutionCell(confidence, None, cell_label(token_text(token)), "", hover)


def evolution_heatmaps(view: EvolutionView, token_text: TokenText) -> list[go.Heatmap]:
    """Two layers: grey masked cells below, confidence-coloured committed cells above (each labels its own cells)."""
    grid = [[evolution_cell(view, token_text, k, j) for j in range(view.length)] for k in view.rows]
    rows = [f"<b>★ draft {k + 1}</b>" if view.verified and k == view.chosen else f"draft {k + 1}" for k in view.rows]
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
    row_of = {k: row for row, k in enumerate(view.rows)}
    if not view.verified:
        return [cell_frame(j, row_of[k], CHANGED_COLOUR, 3) for (k, j), _ in view.changed if k in row_of]
    frames = []
    for k, row in row_of.items():
        width = 3 if k == view.chosen else 2
        frames += [cell_frame(j, row, ACCEPTED_COLOUR, width) for j in range(min(view.accept_lens[k], view.length))]
        if view.accept_lens[k] < len(view.tokens[k]):
            frames.append(cell_frame(view.accept_lens[k], row, REJECTED_COLOUR, width))
    return frames


def evolution_title(view: EvolutionView) -> str:
    trace = view.trace
    details = [setting_label(trace)]  # a second, smaller title line: the panel sits in half the page's width
    if view.noise_level is not None:
        details.append(f"nearest tokens from noise t={view.noise_level:.2f}")
    if view.verified:
        details.append(f"accepted {trace.accept_len} of {view.length} + 1 from the target")
    if view.kind == "tree":  # a draft tree refined along its own paths (drafters/diffusion.py), pass 0's first
        step = f"draft tree after refinement pass {view.shown}/{view.last}" + (
            f" · {len(view.changed)} new" if view.shown else ""
        )
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
    rejected token a red one. Past ``MAX_ROWS`` drafts only the chosen one and the longest accepted others show, and
    the axis title says how many more there are and how little of them was accepted.
    """
    message = evolution_message(trace)
    if message is not None:
        return message
    view = evolution_view(trace, step)
    hidden = len(view.tokens) - len(view.rows)
    x_title = "position in block"
    if hidden and view.verified:
        most = max(view.accept_lens[k] for k in range(len(view.tokens)) if k not in view.rows)
        x_title += f"<br>{hidden} more drafts not shown: each accepted {most} or fewer"
    elif hidden:
        x_title += f"<br>{hidden} more drafts not shown"
    fig = go.Figure(data=evolution_heatmaps(view, token_text))
    fig.update_layout(
        title=evolution_title(view),
        shapes=verdict_frames(view),
        height=max(220, 90 + ROW_PX * len(view.rows) + (18 if hidden else 0)),
        margin={"l": 20, "r": 20, "t": 64, "b": 58 if hidden else 40},
        xaxis={"title": x_title, "type": "category", "side": "bottom"},
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
