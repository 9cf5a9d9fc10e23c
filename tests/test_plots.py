"""The figure builders against the traces they draw: hand-made rounds with known cells, and real engine runs whose
results (tau, token ids, accepted paths) are the oracle."""

from __future__ import annotations

import math
from collections import Counter

import plotly.graph_objects as go
import pytest

from tests.fakes import ScriptedDrafter, round_trace
from xpress_core import plots
from xpress_core.config import DecodeConfig
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import Models, decode
from xpress_core.models import encode_prompt, load_models
from xpress_core.plots.evolution import evolution_view
from xpress_core.trace import MASKED, DecodeResult, DenoiseStep


def token_text(token: int) -> str:
    return f"t{token}"


# K=2 drafts, L=3, T=2 steps. Draft 1 is accepted for 2 tokens, draft 2 for none; the target then adds token 11.
STEP_1 = DenoiseStep(tokens=((5, MASKED, MASKED), (6, MASKED, 9)), confidence=((0.9, 0.0, 0.0), (0.4, 0.0, 0.7)))
STEP_2 = DenoiseStep(tokens=((5, 7, 8), (6, 3, 9)), confidence=((0.9, 0.8, 0.2), (0.4, 0.3, 0.7)))
ROUND = round_trace(
    steps=(STEP_1, STEP_2),
    drafts=STEP_2.tokens,
    draft_accept_lens=(2, 0),
    accepted=(5, 7),
    emitted=(5, 7, 11),
    new_tokens_total=4,
)


def heatmaps(fig: go.Figure) -> tuple[go.Heatmap, go.Heatmap]:
    masked, drafts = (t for t in fig.data if isinstance(t, go.Heatmap))
    return masked, drafts


def framed_cells(fig: go.Figure, colour: str) -> set[tuple[int, int]]:
    """(row, column) of the cells with a frame of this colour."""
    return {(round(s.y0 + 0.5), round(s.x0 + 0.5)) for s in fig.layout.shapes if s.line.color == colour}


def test_draft_evolution_first_step_shows_masked_cells_and_no_verdict():
    fig = plots.draft_evolution_figure(ROUND, token_text, step=0)
    masked, drafts = heatmaps(fig)
    expected_masked = {(k, j) for k in range(2) for j in range(3) if STEP_1.tokens[k][j] == MASKED}
    assert {(k, j) for k in range(2) for j in range(3) if drafts.z[k][j] is None} == expected_masked
    assert {(k, j) for k in range(2) for j in range(3) if masked.z[k][j] is not None} == expected_masked
    assert drafts.text[0][0] == "t5" and drafts.text[1][2] == "t9"
    assert drafts.z[1][2] == pytest.approx(0.7)
    assert masked.text[0][1] == "MASK" and drafts.text[0][1] == ""
    assert not fig.layout.shapes  # the verifier has not seen the drafts yet
    assert "denoise step 1/2" in fig.layout.title.text


def test_draft_evolution_last_step_marks_accepted_path_and_first_rejection():
    fig = plots.draft_evolution_figure(ROUND, token_text)  # None = last step
    _, drafts = heatmaps(fig)
    assert [list(row) for row in drafts.text] == [["t5", "t7", "t8"], ["t6", "t3", "t9"]]
    assert framed_cells(fig, plots.ACCEPTED_COLOUR) == {(0, 0), (0, 1)}
    assert framed_cells(fig, plots.REJECTED_COLOUR) == {(0, 2), (1, 0)}
    assert "accepted 2 of 3" in fig.layout.title.text
    assert "★ draft 1" in drafts.y[0]
    assert "the target chose 't11'" in drafts.customdata[0][2]


def test_draft_evolution_of_a_tree_shows_its_paths_with_empty_cells_past_their_ends():
    """A tree's drafts are its root-to-leaf paths, of different lengths: one row each, the cells past a path's end
    empty (neither a token nor masked), and a path accepted to its end has no rejected cell."""
    one_row = DenoiseStep(tokens=((5, MASKED, 9),), confidence=((0.9, 0.0, 0.6),))
    paths = DenoiseStep(tokens=((5, 7, 9), (5, 8), (6,)), confidence=((0.9, 0.5, 0.6), (0.9, 0.3), (0.1,)))
    trace = round_trace(
        steps=(one_row, paths),
        drafts=paths.tokens,
        draft_accept_lens=(1, 2, 0),
        accepted=(5, 8),
        emitted=(5, 8, 4),
        new_tokens_total=4,
    )
    first = plots.draft_evolution_figure(trace, token_text, step=0)
    assert [list(row) for row in heatmaps(first)[1].text] == [["t5", "", "t9"]]
    fig = plots.draft_evolution_figure(trace, token_text)
    masked, drafts = heatmaps(fig)
    assert [list(row) for row in drafts.text] == [["t5", "t7", "t9"], ["t5", "t8", ""], ["t6", "", ""]]
    assert drafts.z[1][2] is None and masked.z[1][2] is None and drafts.z[2][0] == pytest.approx(0.1)
    assert masked.text[1][2] == "" and drafts.customdata[2][1] == ""  # nothing printed or hovered there
    assert framed_cells(fig, plots.ACCEPTED_COLOUR) == {(0, 0), (1, 0), (1, 1)}
    assert framed_cells(fig, plots.REJECTED_COLOUR) == {(0, 1), (2, 0)}  # path 2 was accepted whole
    assert "★ draft 2" in drafts.y[1] and len(drafts.y) == 3


def test_a_tree_of_sixteen_paths_shows_the_chosen_one_and_the_longest_accepted_in_a_bounded_panel():
    """K=4 · T=3: 16 root-to-leaf paths. The panel keeps MAX_ROWS rows (the chosen path, then the most accepted
    others, in their own order), frames them as before and says what it left out; every step shows the same rows."""
    accept_lens = (0, 1, 0, 2, 1, 0, 0, 3, 0, 1, 0, 4, 0, 0, 2, 0)  # path 12 is chosen; 8, 4 and 15 come next
    paths = tuple((100 + k, 200 + k, 300 + k, 400 + k, 500 + k) for k in range(16))
    masked = tuple((100 + k, MASKED, MASKED, MASKED, MASKED) for k in range(16))
    trace = round_trace(
        steps=(DenoiseStep(masked, ((0.5,) * 5,) * 16), DenoiseStep(paths, ((0.5,) * 5,) * 16)),
        drafts=paths,
        draft_accept_lens=accept_lens,
        accepted=paths[11][:4],
        emitted=(*paths[11][:4], 7),
        new_tokens_total=5,
    )
    assert plots.MAX_ROWS == 5
    for step in (0, None):
        fig = plots.draft_evolution_figure(trace, token_text, step=step)
        _, drafts = heatmaps(fig)
        assert [row.split("draft ")[1].split("<")[0] for row in drafts.y] == ["2", "4", "8", "12", "15"]
        assert fig.layout.height <= 90 + 42 * plots.MAX_ROWS + 18
        assert "11 more drafts not shown" in fig.layout.xaxis.title.text
    assert "<b>★ draft 12</b>" == drafts.y[3] and list(drafts.text[3][:2]) == ["t111", "t211"]
    assert "each accepted 1 or fewer" in fig.layout.xaxis.title.text  # the best hidden path: 1 token
    accepted = {(row, col) for row, k in enumerate((1, 3, 7, 11, 14)) for col in range(accept_lens[k])}
    assert framed_cells(fig, plots.ACCEPTED_COLOUR) == accepted
    assert framed_cells(fig, plots.REJECTED_COLOUR) == {
        (row, accept_lens[k]) for row, k in enumerate((1, 3, 7, 11, 14))
    }


def test_every_round_of_auto_renders_at_every_step(embedded):
    """The embedded pair under ``auto`` (the setting chosen at load, plain rounds where drafting stops paying): every
    drafting round's panel renders at each of its steps, and after the last one shows exactly the drafts the round
    verified."""
    prompt = encode_prompt(embedded.tokenizer, "Tell me a story about a dragon who is afraid of the dark.", chat=True)
    events = list(decode(embedded, prompt, DecodeConfig(auto=True, max_new_tokens=64), watch=True))
    drafting = [t for t in events[1:-1] if t.drafts]
    assert drafting
    for trace in drafting:
        for step in range(len(trace.steps)):
            plots.draft_evolution_figure(trace, token_text, step=step)
        assert evolution_view(trace, None).tokens == trace.drafts


def test_draft_evolution_step_is_clamped_and_special_rounds_explain_themselves():
    assert (
        plots.draft_evolution_figure(ROUND, token_text, step=99).layout.title.text
        == plots.draft_evolution_figure(ROUND, token_text).layout.title.text
    )
    prefill = plots.draft_evolution_figure(round_trace(index=0), token_text)
    assert not heatmaps_present(prefill) and "prefill" in prefill.layout.annotations[0].text
    plain = plots.draft_evolution_figure(round_trace(index=3), token_text)
    assert not heatmaps_present(plain) and "No drafter" in plain.layout.annotations[0].text


def test_draft_evolution_of_the_gaussian_drafter_shows_nearest_tokens_per_noise_level():
    noisy = DenoiseStep(tokens=((5, 4, 2), (6, 3, 9)), confidence=((0.5, 0.1, 0.2), (0.4, 0.3, 0.6)), noise_level=1.0)
    clean = DenoiseStep(tokens=((5, 7, 8), (6, 3, 9)), confidence=((0.9, 0.8, 0.2), (0.4, 0.3, 0.7)), noise_level=0.5)
    trace = round_trace(
        steps=(noisy, clean), drafts=clean.tokens, draft_accept_lens=(2, 0), accepted=(5, 7), emitted=(5, 7, 11)
    )
    fig = plots.draft_evolution_figure(trace, token_text, step=0)
    masked, drafts = heatmaps(fig)
    assert all(cell is None for row in masked.z for cell in row)  # nothing is masked in the continuous drafter
    assert [list(row) for row in drafts.text] == [["t5", "t4", "t2"], ["t6", "t3", "t9"]]
    assert drafts.z[0][1] == pytest.approx(0.1)
    assert "nearest tokens from noise t=1.00" in fig.layout.title.text
    assert "nearest token at noise t=1.00: 't4'" in drafts.customdata[0][1]
    last = plots.draft_evolution_figure(trace, token_text)
    assert "t=0.50" in last.layout.title.text and "accepted 2 of 3" in last.layout.title.text


def heatmaps_present(fig: go.Figure) -> bool:
    return any(isinstance(t, go.Heatmap) for t in fig.data)


def test_token_labels_escape_plotly_markup_and_show_whitespace():
    assert plots.visible_text("<|end|>\n") == "&lt;|end|&gt;⏎"
    assert plots.cell_label(" the") == "␣the"
    assert plots.cell_label("abcdefghij") == "abcde…"


def test_empty_inputs_give_message_panels():
    for fig in (plots.accept_length_figure([]), plots.latency_figure([]), plots.provenance_figure([], token_text)):
        assert not fig.data and fig.layout.annotations


# --- against real engine runs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(zoo):
    """A diffusion-drafter run, a run whose drafter knows the target's continuation (long acceptance), and plain."""
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    oracle = Models(models.target, models.tokenizer, ScriptedDrafter(models.target, "oracle"))
    prompt = encode_prompt(models.tokenizer, "I want to book a table", chat=True)
    cfg = DecodeConfig(drafts=3, steps=2, block=4, max_new_tokens=30)

    def run(m):
        events = list(decode(m, prompt, cfg, watch=True))
        assert isinstance(events[-1], DecodeResult)
        return events[:-1], events[-1]

    return {
        "diffusion": run(models),
        "oracle": run(oracle),
        "plain": run(Models(models.target, models.tokenizer, NoDrafter())),
    }


@pytest.mark.parametrize("name", ["diffusion", "oracle"])
def test_provenance_follows_each_rounds_accepted_path(runs, name):
    traces, result = runs[name]
    origins = plots.token_provenance(traces)
    assert tuple(o.token for o in origins) == result.token_ids
    for trace in traces:
        mine = [o for o in origins if o.round == trace.index]
        drafted = [o.token for o in mine if o.source == plots.FROM_DRAFT]
        assert drafted == list(trace.accepted[: len(drafted)])
        assert len(drafted) == min(trace.accept_len, len(trace.emitted))
        assert sum(o.source == plots.FROM_TARGET for o in mine) == len(trace.emitted) - len(drafted)
    if name == "oracle":
        assert sum(o.source == plots.FROM_DRAFT for o in origins) > len(origins) / 2


def test_provenance_figure_lays_out_every_token_once(runs):
    traces, result = runs["oracle"]
    fig = plots.provenance_figure(traces, token_text)
    labels = [label for bar in fig.data for label in bar.text]
    assert sorted(labels) == sorted(token_text(t) for t in result.token_ids)
    drafted = next(bar for bar in fig.data if bar.name == plots.FROM_DRAFT)
    assert len(drafted.text) == sum(min(t.accept_len, len(t.emitted)) for t in traces)
    assert all(start + width <= plots.WRAP_CHARS for bar in fig.data for start, width in zip(bar.base, bar.x))


@pytest.mark.parametrize("name", ["diffusion", "oracle"])
def test_accept_length_figure_matches_the_engine_result(runs, name):
    traces, result = runs[name]
    fig = plots.accept_length_figure(traces)
    chosen = next(t for t in fig.data if t.name == "chosen path")
    assert tuple(chosen.y) == result.accept_lens
    tau = next(t for t in fig.data if t.name.startswith("running τ"))
    assert tau.y[-1] == pytest.approx(result.tau)
    histogram = next(t for t in fig.data if isinstance(t, go.Bar))
    assert sum(histogram.y) == result.rounds
    assert histogram.y[0] == sum(n == 0 for n in result.accept_lens)
    assert {int(x): y for x, y in zip(histogram.x, histogram.y) if y} == Counter(result.accept_lens)  # every bin
    singles = next(t for t in fig.data if t.name == "each draft")
    assert sorted(singles.y) == sorted(n for t in traces[1:] for n in t.draft_accept_lens)


def test_latency_figure_stacks_the_engine_timings(runs):
    traces, result = runs["diffusion"]
    plain_traces, plain_result = runs["plain"]
    fig = plots.latency_figure(traces, plain_traces)
    bars = [t for t in fig.data if isinstance(t, go.Bar)]
    assert fig.layout.barmode == "stack"
    stacked = [sum(b.y[i] for b in bars) for i in range(len(traces))]
    assert stacked[0] == pytest.approx(1000 * result.prefill_s)
    assert sum(stacked[1:]) == pytest.approx(1000 * (result.draft_s + result.verify_s + result.other_s))
    lines = {t.name: t for t in fig.data if isinstance(t, go.Scatter)}
    # The last round's elapsed time is the result's total up to the final bookkeeping: within a few per cent.
    assert lines["speculative tokens/s"].y[-1] == pytest.approx(result.tokens_per_s, rel=0.05)
    assert lines["plain tokens/s"].y[-1] == pytest.approx(plain_result.tokens_per_s, rel=0.05)
    assert lines["plain tokens/s"].x[-1] == plain_result.new_tokens


def test_latency_figure_in_plain_steps_draws_each_rounds_cost_and_the_break_even_line(runs):
    traces, result = runs["oracle"]
    plain_step_s = 0.004
    fig = plots.latency_figure(traces, plain_step_s=plain_step_s)
    bars = [t for t in fig.data if isinstance(t, go.Bar)]
    assert [b.name for b in bars] == ["draft", "verify", "other"]
    assert list(bars[0].x) == list(range(1, result.rounds + 1))  # drafting rounds only: the prefill is left out
    costs = [sum(b.y[i] for b in bars) for i in range(result.rounds)]
    assert costs == pytest.approx([(t.draft_s + t.verify_s + t.other_s) / plain_step_s for t in traces[1:]])
    lines = {t.name.split(" (")[0]: t for t in fig.data if isinstance(t, go.Scatter)}
    assert list(lines["tokens emitted"].y) == [n + 1 for n in result.accept_lens]
    break_even = sum(costs) / len(costs)
    assert lines[f"break-even τ {break_even:.2f}"].y == pytest.approx((break_even, break_even))
    assert lines[f"τ {result.tau:.2f}"].y == (result.tau, result.tau)
    speedup = result.tau / break_even
    assert fig.layout.title.text.endswith(f"= {speedup:.2f}×")
    labels = [a.text for a in fig.layout.annotations]
    assert f"τ {result.tau:.2f}" in labels and f"break-even {break_even:.2f}" in labels


def test_the_draft_panel_names_the_rounds_setting_and_says_when_a_round_was_a_plain_step():
    assert "K=1 T=1 L=4" in plots.draft_evolution_figure(ROUND, token_text).layout.title.text
    plain = plots.draft_evolution_figure(round_trace(index=3, setting=(0, 0, 0)), token_text)
    assert "Round 3: a plain step" in plain.layout.annotations[0].text
    no_drafter = plots.draft_evolution_figure(round_trace(index=3, setting=(1, 1, 8)), token_text)
    assert "No drafter" in no_drafter.layout.annotations[0].text


def test_running_tau_is_the_cumulative_mean_of_tokens_per_round():
    rounds = [round_trace(index=i + 1, accepted=(1,) * n) for i, n in enumerate([0, 3, 1])]
    assert plots.running_tau(rounds) == [1.0, 2.5, pytest.approx(7 / 3)]
    assert math.isclose(plots.running_tau(rounds)[-1], (0 + 3 + 1 + 3) / 3)
