"""The verdict against known values: hand-made rounds with round timings, a real engine run whose result is the
oracle, and the calibration of a plain step on scripted runs."""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import pairwise

import pytest
import torch

from tests.fakes import round_trace
from tests.oracles import run
from xpress_core import verdict
from xpress_core.config import TREE, DecodeConfig
from xpress_core.data import PROMPTS
from xpress_core.engine import decode
from xpress_core.models import EMBEDDED_DRAFTER, EMBEDDED_TARGET, encode_prompt, load_models
from xpress_core.trace import DecodeResult, Refinement, RoundTrace
from xpress_core.tree import build_tree

PREFILL = round_trace(index=0, draft_s=0.0, verify_s=0.050, other_s=0.0)
# Two rounds at 2 ms a plain step: draft 1 + verify 2.5 + other 0.5 ms = 2 plain steps each; 1 then 3 accepted.
ROUNDS = [
    PREFILL,
    round_trace(index=1, accepted=(5,), draft_s=0.001, verify_s=0.0025, other_s=0.0005),
    round_trace(index=2, accepted=(5, 6, 7), draft_s=0.001, verify_s=0.0025, other_s=0.0005),
]


def test_a_rounds_cost_in_plain_steps_the_break_even_and_the_speedup():
    cost = verdict.round_cost(ROUNDS, plain_step_s=0.002)
    assert cost.rounds == 2  # the prefill is left out
    assert cost.tau == 3.0  # (1 + 3 accepted + 2 of the target's own) / 2 rounds
    assert [cost.steps(stage) for stage in verdict.STAGES] == pytest.approx([0.5, 1.25, 0.25])
    assert cost.plain_steps == pytest.approx(2.0)
    assert cost.speedup == pytest.approx(1.5)
    assert verdict.headline(cost) == "τ 3.00 × (1 / 2.00 plain steps per round) → 1.50× faster than plain"
    assert verdict.breakdown(cost) == (
        "a round = draft 0.50 + verify 1.25 + other 0.25 plain steps of 2.000 ms · break-even τ 2.00"
    )


def test_the_whole_reply_counts_the_prefill_that_plain_decoding_pays_alike():
    """50 ms prefill, then 2 rounds of 4 ms emitting 2 and 4 tokens; plain decoding: the same prefill, then 6 steps of
    2 ms: 62 ms against 58 ms, while the rounds alone are 1.5x plain's speed."""
    rounds = [
        PREFILL,
        round_trace(index=1, accepted=(5,), emitted=(5, 8), draft_s=0.001, verify_s=0.0025, other_s=0.0005),
        round_trace(index=2, accepted=(5, 6, 7), emitted=(5, 6, 7, 9), draft_s=0.001, verify_s=0.0025, other_s=5e-4),
    ]
    cost = verdict.reply_cost(rounds, plain_step_s=0.002)
    assert cost.prefill_s == 0.050 and cost.tokens_after_prefill == 6
    assert cost.time_s == pytest.approx(0.058) and cost.plain_s == pytest.approx(0.062)
    assert cost.speedup == pytest.approx(0.062 / 0.058) and cost.rounds.speedup == pytest.approx(1.5)
    assert verdict.reply_headline(cost) == (
        "whole reply (prefill 50 ms included): 1.07× faster than plain · "
        "per round: τ 3.00 × (1 / 2.00 plain steps per round) → 1.50× faster than plain"
    )
    assert verdict.reply_cost(rounds[:1], 0.002) is None and verdict.reply_cost(rounds[1:], 0.002) is None


def race_result(prefill_s: float, time_s: float, tokens: int = 7) -> DecodeResult:
    return DecodeResult(
        text="",
        token_ids=(1,) * tokens,
        rounds=2,
        accept_lens=(1, 3),
        time_s=time_s,
        draft_s=0.0,
        verify_s=0.0,
        other_s=0.0,
        prefill_s=prefill_s,
        peak_mem_mb=0.0,
        stop_reason="eos",
        target_forwards=3,
    )


def test_the_race_agrees_with_the_verdict_within_15_percent_or_says_why_not():
    """The verdict predicts 62 / 58 ms; a Race whose plain run took 62 ms agrees, one whose plain prefill took
    10 ms (plain run 22 ms) does not, and the line names both prefills."""
    cost = verdict.reply_cost(
        [
            PREFILL,
            round_trace(index=1, accepted=(5,), emitted=(5, 8), draft_s=0.001, verify_s=0.0025, other_s=0.0005),
            round_trace(
                index=2, accepted=(5, 6, 7), emitted=(5, 6, 7, 9), draft_s=0.001, verify_s=0.0025, other_s=5e-4
            ),
        ],
        plain_step_s=0.002,
    )
    spec = race_result(0.050, 0.058)
    ok, line = verdict.agreement(cost, spec, race_result(0.050, 0.062))
    assert ok and line == "agrees with the verdict's whole reply (×1.07) ✓"
    assert verdict.agreement(cost, spec, race_result(0.050, 0.062 * 1.14))[0]
    assert not verdict.agreement(cost, spec, race_result(0.050, 0.062 * 1.16))[0]
    ok, line = verdict.agreement(cost, spec, race_result(0.010, 0.022))
    assert not ok and "the verdict's whole reply says ×1.07, the Race ×0.38" in line
    assert "prefill took 50 ms in the speculative run and 10 ms in the plain one" in line


def test_a_slower_reply_says_so_and_nothing_is_claimed_before_the_first_round():
    slow = verdict.round_cost(ROUNDS, plain_step_s=0.001)  # each round costs 4 plain steps and emits 3 tokens
    assert slow.speedup == pytest.approx(0.75)
    assert verdict.headline(slow).endswith("→ 0.75× plain's speed")
    assert verdict.round_cost(ROUNDS[:1], plain_step_s=0.002) is None
    assert verdict.round_cost(ROUNDS, plain_step_s=0.0) is None


def test_a_plain_step_is_the_mean_of_the_rounds_that_drafted_nothing():
    drafted = round_trace(index=1, drafts=((5, 6),), verify_s=0.009)
    plain = [
        round_trace(index=i, draft_s=0.0, verify_s=s, other_s=0.0, setting=(0, 0, 0)) for i, s in [(2, 2e-3), (3, 4e-3)]
    ]
    assert verdict.plain_step_s([PREFILL, drafted, *plain]) == pytest.approx(3e-3)
    assert verdict.plain_step_s([PREFILL, drafted]) is None


def test_the_settings_summary_counts_each_rounds_setting_and_the_plain_steps():
    rounds = [PREFILL] + [round_trace(index=i, setting=s) for i, s in enumerate([(1, 1, 4), (0, 0, 0), (1, 1, 4)], 1)]
    assert [verdict.setting_label(t) for t in rounds[1:]] == ["K=1 T=1 L=4", "plain step", "K=1 T=1 L=4"]
    assert verdict.settings_summary(rounds) == "K=1 T=1 L=4 × 2 · plain step × 1"  # the prefill is no round


def test_the_cost_of_an_engine_run_is_its_results_own(zoo):
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    prompt = encode_prompt(models.tokenizer, "I want to book a table", chat=True)
    traces, result = run(models, prompt, DecodeConfig(drafts=3, steps=2, block=4, max_new_tokens=30))
    cost = verdict.round_cost(traces, plain_step_s=0.003)
    assert cost.tau == result.tau  # the same tokens-per-round, exactly
    assert cost.accept_lens == result.accept_lens
    assert (cost.draft_s, cost.verify_s, cost.other_s) == pytest.approx(
        (result.draft_s, result.verify_s, result.other_s)
    )
    round_s = (result.draft_s + result.verify_s + result.other_s) / result.rounds
    assert cost.plain_steps == pytest.approx(round_s / 0.003)


def scripted_decode(step_times: list[list[float]]):
    """A stand-in for ``engine.decode`` whose n-th run has rounds of the given times (verify only) after a prefill."""
    runs = iter(step_times)

    def fake(models, prompt_ids, cfg):
        times = next(runs)
        yield round_trace(index=0, verify_s=1.0)  # a prefill that would spoil the mean if it counted
        for i, seconds in enumerate(times, start=1):
            yield round_trace(index=i, draft_s=0.0, verify_s=seconds, other_s=0.0)

    return fake


def test_calibration_skips_the_warm_up_and_averages_the_plain_steps(monkeypatch):
    warm_up = [0.9] * verdict.CALIBRATION_TOKENS
    timed = [[0.002] * 20, [0.004] * 20]  # 40 steps: enough after two timed runs
    monkeypatch.setattr(verdict, "decode", scripted_decode([warm_up, *timed, [5.0] * 20]))
    assert verdict.calibrate_plain_step(None, None) == pytest.approx(0.003)


def test_plain_steps_timed_after_a_reply_are_the_mean_of_one_run(monkeypatch):
    monkeypatch.setattr(verdict, "decode", scripted_decode([[0.002, 0.004, 0.006]]))
    assert verdict.time_plain_steps(None, None) == pytest.approx(0.004)  # no warm-up: the models are warm by then


def test_calibration_repeats_runs_that_end_early_and_gives_up_on_empty_ones(monkeypatch):
    short = [[0.001, 0.002]] * verdict.CALIBRATION_RUNS  # every run ends after 2 steps
    monkeypatch.setattr(verdict, "decode", scripted_decode(short))
    assert verdict.calibrate_plain_step(None, None) == pytest.approx(0.0015)
    monkeypatch.setattr(verdict, "decode", scripted_decode([[]] * verdict.CALIBRATION_RUNS))
    assert verdict.calibrate_plain_step(None, None) is None


def test_calibration_times_real_plain_steps(zoo, monkeypatch):
    models = load_models(zoo["llama"], "none", device="cpu")
    seen: list[list[RoundTrace]] = []

    def recording(*args):
        seen.append([e for e in decode(*args) if isinstance(e, RoundTrace)])
        yield from seen[-1]

    monkeypatch.setattr(verdict, "decode", recording)
    step = verdict.calibrate_plain_step(models, encode_prompt(models.tokenizer, "Once upon a time", chat=False))
    timed = [t for traces in seen[1:] for t in traces if t.index > 0]  # the first run warms up
    assert len(timed) >= verdict.CALIBRATION_ROUNDS or len(seen) == verdict.CALIBRATION_RUNS
    assert step == pytest.approx(sum(t.draft_s + t.verify_s + t.other_s for t in timed) / len(timed))


def refined_round(before, after, verified, accepted, emitted) -> RoundTrace:
    """A round whose passes turned pass 0's drafts ``before`` into ``after``; ``verified``: the drafts its tree was
    built from."""
    return round_trace(
        accepted=accepted,
        emitted=emitted,
        tree=build_tree(99, [list(d) for d in verified]),
        refinement=Refinement(before, after),
        setting=(len(verified), 3, 4),
    )


# Two rows refined (row 0 changed at position 1, which is accepted, row 1 at position 2): five nodes pass 0 did not
# draft, (1, 5) (1, 5, 3) (1, 5, 3, 4) (9, 2, 6) (9, 2, 6, 4), two of them accepted; pass 0's best row matched one
# emitted token.
CHAIN = refined_round(
    before=((1, 2, 3, 4), (9, 2, 3, 4)),
    after=((1, 5, 3, 4), (9, 2, 6, 4)),
    verified=((1, 5, 3, 4), (9, 2, 6, 4)),
    accepted=(1, 5, 3),
    emitted=(1, 5, 3, 7),
)
# A tree refined along its paths: one new node, accepted; pass 0's tree's best path matched two emitted tokens.
REFINED_TREE = refined_round(
    before=((1, 2, 3), (1, 4), (6,)),
    after=((1, 2, 8), (1, 4), (6,)),
    verified=((1, 2, 8), (1, 4), (6,)),
    accepted=(1, 2, 8),
    emitted=(1, 2, 8, 5),
)
# The passes built the tree pass 0 had: nothing new, the same τ.
HELD = refined_round(
    before=((1, 2, 3), (1, 2, 8), (6,)),
    after=((1, 2, 3), (1, 2, 8), (6,)),
    verified=((1, 2, 3), (1, 2, 8), (6,)),
    accepted=(1, 2, 8),
    emitted=(1, 2, 8, 5),
)
UNREFINED = round_trace(accepted=(5, 6), emitted=(5, 6, 7))  # T = 1: pass 0's draft is the draft
# Pass 0 matched both emitted tokens and drafted two more: it would have been accepted further, how far unseen.
WORSE = refined_round(((1, 2, 3, 4),), ((1, 7, 3, 4),), ((1, 7, 3, 4),), (1,), (1, 2))
# The reply stopped at its second token (say an end of turn), inside the accepted tokens, which pass 0 reached too.
STOPPED = refined_round(((1, 2, 3, 4),), ((1, 2, 3, 5),), ((1, 2, 3, 5),), (1, 2, 3, 5), (1, 2))
# The target's context left room for two draft tokens: the passes' change at position 2 was never verified.
CUT = refined_round(((1, 2, 3, 4),), ((1, 2, 5, 6),), ((1, 2),), (1, 2), (1, 2, 9))


@pytest.mark.parametrize(
    "rounds,expected",
    [
        ([CHAIN], verdict.RefinementGain(5, 2, 4.0, 2.0, False)),
        ([REFINED_TREE], verdict.RefinementGain(1, 1, 4.0, 3.0, False)),
        ([HELD], verdict.RefinementGain(0, 0, 4.0, 4.0, False)),
        ([WORSE], verdict.RefinementGain(3, 0, 2.0, 3.0, True)),
        ([STOPPED], verdict.RefinementGain(1, 1, 5.0, 5.0, False)),
        ([CUT], verdict.RefinementGain(0, 0, 3.0, 3.0, False)),
        # A reply: the prefill left out, a round without passes counts as it was; τ (4 + 4 + 3) / 3, without
        # (2 + 3 + 3) / 3.
        ([PREFILL, CHAIN, REFINED_TREE, UNREFINED], verdict.RefinementGain(6, 3, 11 / 3, 8 / 3, False)),
        ([PREFILL, CHAIN, WORSE], verdict.RefinementGain(8, 2, 3.0, 2.5, True)),
    ],
)
def test_what_the_passes_bought_on_hand_made_rounds(rounds, expected):
    assert verdict.refinement_gain(rounds) == pytest.approx(expected)


def test_nothing_is_said_of_passes_where_none_ran():
    assert verdict.refinement_gain([PREFILL, UNREFINED]) is None and verdict.refinement_gain(ROUNDS) is None
    assert verdict.refinement_gain([PREFILL]) is None


def test_the_refinement_line_says_where_tau_without_passes_is_a_lower_bound():
    exact, bound = verdict.RefinementGain(12, 7, 2.514, 2.3, False), verdict.RefinementGain(3, 0, 2.0, 2.5, True)
    assert verdict.refinement_line(exact) == (
        "Refinement passes: 12 new draft tokens, 7 of them accepted · τ 2.51 with them, 2.30 without "
        "(pass 0's drafts against the tokens emitted)"
    )
    assert "τ 2.00 with them, ≥ 2.50 without" in verdict.refinement_line(bound)


QUICK = [json.loads(line)["messages"] for line in (PROMPTS / "quick.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def embedded():
    """The shipped pair: a drafter whose refiner head was trained, so its passes change tokens."""
    models = load_models(EMBEDDED_TARGET, str(EMBEDDED_DRAFTER), device="cpu")
    assert models.drafter.step_kind == "pass"
    return models, [encode_prompt(models.tokenizer, messages, chat=True) for messages in QUICK]


def first_round_accepted(models, prompt_ids, cfg: DecodeConfig) -> tuple[int, int]:
    """A fresh request's prefill token and what its first round accepts at T = 1: pass 0's draft, from the state
    after ``prompt_ids``."""
    events = list(decode(models, prompt_ids, replace(cfg, steps=1, max_new_tokens=cfg.block + 2)))
    return events[0].emitted[0], events[1].accept_len


@pytest.mark.parametrize("diversity,drafts", [("none", 1), ("branch-first", 3), ("tree", 4)])
def test_tau_without_passes_is_what_pass_0_accepts_from_each_rounds_own_start(embedded, diversity, drafts):
    """The oracle per round: a fresh request on the round's prefix at T = 1 (greedy fp32: pass 0's draft is the
    T = 1 draft) accepts what ``refinement_gain`` credits pass 0 with; at least that where it says "≥". The reply's
    τ without passes is no whole-reply counterfactual: its rounds would have started elsewhere once an accepted
    length differed, so this is checked round by round, not against a T = 1 reply's τ."""
    models, prompts = embedded
    cfg = DecodeConfig(drafts=drafts, steps=3, block=8, diversity=diversity, max_new_tokens=48)
    checked = bought = changed = 0
    for prompt_ids in prompts:
        traces = [e for e in decode(models, prompt_ids, cfg) if isinstance(e, RoundTrace)]
        output = [token for trace in traces for token in trace.emitted]
        for before, trace in pairwise(traces):
            gain = verdict.refinement_gain([trace])
            without = round(gain.tau_without) - 1
            assert gain.changed_accepted <= min(gain.changed, trace.accept_len)
            changed += gain.changed
            bought += without != trace.accept_len
            if len(trace.emitted) < trace.accept_len + 1:
                continue  # the reply's stop cut this round: what was accepted past it is the reply's no more
            root = output[before.new_tokens_total - 1]
            prefix = torch.tensor([prompt_ids[0].tolist() + output[: before.new_tokens_total - 1]])
            first, accepted = first_round_accepted(models, prefix, cfg)
            assert first == root  # greedy fp32: the fresh request reaches the round's own state
            assert accepted >= without if gain.at_least else accepted == without
            checked += 1
    assert checked >= 10 and changed > 0 and bought > 0  # the passes changed tokens, and that changed τ


def test_the_passes_record_the_same_without_being_watched_as_the_panel_shows(embedded):
    """Unwatched rounds keep what the passes did (``Refinement``), the same as the watched steps: pass 0's drafts (K
    rows, or the T = 1 tree's paths) and the last pass's, which are the drafts verified."""
    models, prompts = embedded
    for cfg in (DecodeConfig(drafts=2, steps=3, block=6, diversity="branch-first"), DecodeConfig(steps=3)):
        cfg = replace(cfg, max_new_tokens=32)
        for prompt_ids in prompts[:3]:
            watched, _ = run(models, prompt_ids, cfg)
            unwatched = [e for e in decode(models, prompt_ids, cfg) if isinstance(e, RoundTrace)]
            assert [t.refinement for t in watched] == [t.refinement for t in unwatched]
            for trace in watched[1:]:
                shown = [step.tokens for step in trace.steps]  # every pass's rows, or every pass's tree
                assert {step.kind for step in trace.steps} == {"tree" if cfg.diversity == TREE else "pass"}
                assert (trace.refinement.before, trace.refinement.after) == (shown[0], shown[-1])
                assert trace.refinement.after == trace.drafts


def test_no_refinement_is_recorded_at_t_1_or_without_a_refiner_head(zoo, embedded):
    models = embedded[0]
    no_head = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    for drafter, cfg in [(models, DecodeConfig(steps=1)), (no_head, DecodeConfig(steps=3, block=4))]:
        prompt_ids = encode_prompt(drafter.tokenizer, QUICK[0], chat=True)
        traces = [e for e in decode(drafter, prompt_ids, replace(cfg, max_new_tokens=24)) if isinstance(e, RoundTrace)]
        assert len(traces) > 2 and all(t.refinement is None for t in traces)
        assert verdict.refinement_gain(traces) is None


def test_every_speedup_is_over_the_faster_dtypes_plain_decoding():
    """With fake figures where bf16 runs and its plain step is slower than fp32's, the baseline is fp32's plain step
    (scaled by the dtype choice's own timings); where the run dtype's plain decoding is the faster, it stays."""
    from xpress_core.models import DtypeChoice, DtypeTiming
    from xpress_core.verdict import fastest_plain

    timings = {
        "float32": DtypeTiming(3.0e-3, 6e-3, 3.0e-3, 2e-3),
        "bfloat16": DtypeTiming(4.0e-3, 5e-3, 4.0e-3, 1.5e-3),
    }
    bf16 = DtypeChoice("bfloat16", "measured", 2, timings)
    step, note = fastest_plain(bf16, 4.4e-3)
    assert step == pytest.approx(4.4e-3 * 3.0 / 4.0) and "float32" in note
    assert fastest_plain(DtypeChoice("float32", "measured", 2, timings), 3.1e-3) == (3.1e-3, "")
    assert fastest_plain(None, 2e-3) == (2e-3, "")


def test_the_cli_json_compares_the_reply_with_the_faster_dtypes_plain_decoding():
    """The reply of the prefill-counting test (50 ms, then 2 rounds of 4 ms emitting 6 tokens) run in bf16, whose
    timed plain step (4 ms) is slower than fp32's (3 ms): against fp32 plain decoding, 50 + 6 x 3 = 68 ms over 58, the
    rounds tau 3 in 4 / 3 plain steps a round. A pinned dtype timed nothing: no comparison is claimed."""
    from xpress_core.models import DtypeChoice, DtypeTiming

    rounds = [
        PREFILL,
        round_trace(index=1, accepted=(5,), emitted=(5, 8), draft_s=0.001, verify_s=0.0025, other_s=0.0005),
        round_trace(index=2, accepted=(5, 6, 7), emitted=(5, 6, 7, 9), draft_s=0.001, verify_s=0.0025, other_s=5e-4),
    ]
    timings = {"float32": DtypeTiming(3e-3, 6e-3, 3e-3, 2e-3), "bfloat16": DtypeTiming(4e-3, 5e-3, 4e-3, 1.5e-3)}
    got = verdict.against_fastest_plain(rounds, DtypeChoice("bfloat16", "measured", 2, timings))
    assert got == {
        "dtype": "float32",
        "plain_step_s": pytest.approx(3e-3),
        "speedup": pytest.approx(0.068 / 0.058),
        "rounds_speedup": pytest.approx(3.0 / (4 / 3)),
    }
    assert verdict.against_fastest_plain(rounds, DtypeChoice("float32", "measured", 2, timings))["dtype"] == "float32"
    assert verdict.against_fastest_plain(rounds, DtypeChoice("float32", "pinned by --dtype float32", 2)) is None
