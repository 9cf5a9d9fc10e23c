"""The verdict against known values: hand-made rounds with round timings, a real engine run whose result is the
oracle, and the calibration of a plain step on scripted runs."""

from __future__ import annotations

import pytest

from tests.fakes import round_trace
from tests.oracles import run
from xpress_core import verdict
from xpress_core.config import DecodeConfig
from xpress_core.engine import decode
from xpress_core.models import encode_prompt, load_models
from xpress_core.trace import DecodeResult, RoundTrace

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
