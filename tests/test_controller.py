"""The controller ``auto``: its arithmetic on known numbers, and end to end against the oracles (HF ``generate``,
plain sampling with the same seed, drafters that are always wrong or always right)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace

import pytest
import torch

from tests.fakes import ScriptedDrafter
from tests.oracles import PROMPTS, check_invariants, cli, hf_greedy, run
from xpress_core import controller, counting, engine, hub
from xpress_core.config import DecodeConfig
from xpress_core.controller import (
    CHOSEN_STEPS,
    FIRST_PROBE,
    LAST_PROBE,
    PLAIN_STEP,
    SPECULATE_MARGIN,
    ChosenControl,
    CostModel,
    DraftingWorth,
    FixedControl,
    RecordedRound,
    RoundSetting,
    SettingChoice,
    candidate_settings,
    chance_share,
    choose_setting,
    confirmed,
    denoise_work,
    nodes_worth_verifying,
    path_chances,
    replayed,
    setting_name,
    speed_ratio,
)
from xpress_core.costs import calibration_drafts, fit_draft_costs, fit_verify_costs, timed_in_turns
from xpress_core.counting import MEMORY, PRIOR_ACCEPT, PRIOR_ACCEPT_SAMPLED, AutoControl
from xpress_core.drafters.base import Drafts, NoDrafter
from xpress_core.drafters.masked import MaskedDiffusionDrafter
from xpress_core.engine import Models, calibrate, calibrated, control, decode
from xpress_core.models import encode_prompt, load_models
from xpress_core.trace import MASKED, DenoiseStep, RoundTrace, write_jsonl

# Stage costs like the embedded pair's in bf16 (ms), fixed so that every choice below is reproducible.
COSTS = CostModel(
    draft_forward_s=1.7e-3, draft_position_s=0.065e-3, verify_forward_s=3.0e-3, verify_token_s=0.1e-3, other_s=0.4e-3
)
AUTO = DecodeConfig(auto=True, max_new_tokens=48)


@dataclass(frozen=True)
class Took:
    """A round's measured seconds as the engine hands them over (``engine.Timings``' stages)."""

    draft_s: float
    verify_s: float
    other_s: float


@pytest.fixture(scope="module")
def llama(zoo):
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu", dtype="float32")
    return models, [encode_prompt(models.tokenizer, p, chat=True) for p in PROMPTS]


def test_round_costs_and_acceptance_estimates_on_known_numbers(monkeypatch):
    monkeypatch.setattr(counting, "PRIOR_ACCEPT", 0.5)  # round numbers below
    costs = CostModel(1.0, 0.1, 2.0, 0.5, 0.25)
    assert costs.round_s(RoundSetting(2, 3, 4)) == pytest.approx(3 * (1.0 + 0.1 * 2 * 5) + 2.0 + 0.5 * 9 + 0.25)
    assert costs.round_s(PLAIN_STEP) == pytest.approx(2.0 + 0.5 + 0.25)
    stepped = CostModel(1.0, 0.1, 2.0, 0.5, 0.25, verify_draft_s=0.75)  # a forward over drafts costs a step more
    assert stepped.round_s(RoundSetting(2, 3, 4)) == pytest.approx(costs.round_s(RoundSetting(2, 3, 4)) + 0.75)
    assert stepped.round_s(PLAIN_STEP) == costs.round_s(PLAIN_STEP)
    walked = replace(costs, draft_other_s=0.75)  # a drafting round's acceptance, commit and search; plain rounds': 0.25
    assert walked.round_s(RoundSetting(2, 3, 4)) == pytest.approx(costs.round_s(RoundSetting(2, 3, 4)) + 0.5)
    assert walked.round_s(PLAIN_STEP) == costs.round_s(PLAIN_STEP)
    control = AutoControl(costs, max_block=4)
    assert control.acceptance((1, 1)) == [0.5] * 4  # the prior
    control.observe(RoundSetting(1, 1, 4), 2)  # positions 1 and 2 accepted, 3 rejected, 4 not reached
    # q_i = (accepted + 2 prior_i) / (reached + 2), prior_i = q_{i-1} (q_0 = 1/2), times PRIOR_DECLINE = 0.8 at the
    # first position no round reached.
    single = [2 / 3, 7 / 9, 14 / 27, 0.8 * 14 / 27]
    assert control.acceptance((1, 1)) == pytest.approx(single)
    # More drafts: at the first position 1 - (1 - q_1)^sqrt(K); right after it 0.8 times that, then the same.
    two, four = 1 - (1 / 3) ** math.sqrt(2), 1 - (1 / 3) ** 2
    assert control.acceptance((2, 1)) == pytest.approx([two, 0.8 * two, 0.8 * two, 0.8 * two])
    assert control.acceptance((4, 1)) == pytest.approx([four, 0.8 * four, 0.8 * four, 0.8 * four])
    # Earlier counts decay by MEMORY = 0.9; one draft would have accepted all 4, so (1, 1) counts the round too, (4, 1)
    # does not.
    control.observe(RoundSetting(2, 1, 4), 4, (4, 4))
    q1 = 2.9 / 3.9
    q2 = (1.9 + 2 * q1) / 3.9
    q3 = (1.0 + 2 * q2) / 3.9
    assert control.acceptance((1, 1)) == pytest.approx([q1, q2, q3, (1 + 2 * q3) / 3])
    two = [(1 + 2 * (1 - (1 - q1) ** math.sqrt(2))) / 3]
    two.append((1 + 2 * 0.8 * two[-1]) / 3)
    for _ in range(2):
        two.append((1 + 2 * two[-1]) / 3)
    assert control.acceptance((2, 1)) == pytest.approx(two)
    four = 1 - (1 - q1) ** 2
    assert control.acceptance((4, 1)) == pytest.approx([four, 0.8 * four, 0.8 * four, 0.8 * four])


def test_sampling_starts_from_its_own_lower_prior(llama):
    """A sampled draft token is kept with the target's probability of it: a sampled request's controller starts from
    the sampled prior, the engine says which regime a request is in, and the lower prior can turn the first round into
    a plain step where the greedy one drafts."""
    assert PRIOR_ACCEPT_SAMPLED < PRIOR_ACCEPT
    models, _ = llama
    # The counting model (K separate drafts: no tree chances to read).
    cfgs = (DecodeConfig(auto=True, temperature=t, diversity="branch-first") for t in (0.0, 0.7))
    greedy, sampled = (control(models, cfg, COSTS) for cfg in cfgs)
    assert greedy.acceptance((1, 1)) == pytest.approx([PRIOR_ACCEPT] * greedy.max_block)
    assert sampled.acceptance((1, 1)) == pytest.approx([PRIOR_ACCEPT_SAMPLED] * sampled.max_block)
    # With a drafter forward 2.5x the embedded pair's: greedy opens with (1, 1, 7), expected 1.23x a plain step's
    # rate; sampled, the best is 1.00x, below the margin.
    slow = replace(COSTS, draft_forward_s=2.5 * COSTS.draft_forward_s)
    assert AutoControl(slow, max_block=8).choose(remaining=100) == RoundSetting(1, 1, 7)
    assert AutoControl(slow, max_block=8, sampled=True).choose(remaining=100) == PLAIN_STEP


def test_more_drafts_are_tried_when_one_fails_and_left_when_one_is_enough():
    for right_draft, want_drafts in ((1, 2), (0, 1)):  # only draft 1 is right (K >= 2 pays); draft 0 is right
        control, picks = AutoControl(COSTS, max_block=16), []
        for _ in range(30):
            setting = control.choose(remaining=1000)
            lens = tuple(setting.block if k == right_draft else 0 for k in range(setting.drafts))
            control.observe(setting, max(lens, default=0), tuple(max(lens[:k]) for k in range(1, len(lens) + 1)))
            picks.append(setting)
        assert {s.drafts for s in picks[-10:]} == {want_drafts}, picks
        assert all(s.block == 16 for s in picks[-10:]), picks


def test_round_costs_count_the_forwards_the_drafter_declares(zoo):
    left_to_right = CostModel(1.0, 0.1, 2.0, 0.5, 0.25, draft_work=lambda s: (s.block, s.block * s.drafts))
    assert left_to_right.round_s(RoundSetting(2, 3, 4)) == pytest.approx(4 * (1.0 + 0.1 * 2) + 2.0 + 0.5 * 9 + 0.25)
    assert left_to_right.round_s(PLAIN_STEP) == pytest.approx(2.0 + 0.5 + 0.25)
    models = load_models(zoo["llama"], zoo["ar_drafter"], device="cpu", dtype="float32")
    forwards = []
    models.drafter.model.register_forward_hook(lambda *_: forwards.append(1))
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    for setting in ((2, 1, 5), (1, 2, 3)):  # the autoregressive drafter runs L forwards whatever T
        forwards.clear()
        k, t, block = setting
        _, result = run(models, prompt_ids, DecodeConfig(drafts=k, steps=t, block=block, max_new_tokens=24))
        declared = [models.drafter.draft_work(RoundSetting(*s))[0] for s in result.settings]
        assert len(forwards) == 1 + sum(declared) and declared[0] == setting[2]  # 1: the prompt's forward at start
    costs = calibrate(models)
    assert costs.draft_work(RoundSetting(4, 2, 16)) == (16, 64) and costs.draft_forward_s > 0
    assert costs.draft_other_s > 0  # a drafting round's acceptance over its tree, commit and auto's search, timed


def test_verify_costs_are_fitted_with_the_step_to_a_forward_over_drafts():
    """Forwards timed over a root alone and over 4, 32 and 64 drafted tokens, made from known costs (fixed 5, per
    token 0.1 up to 32 drafted tokens and 0.25 past them, a step of 0.6 for any forward over drafts): the fit gives
    them back, and the cost model then prices a plain step and rounds of drafts as timed."""
    fixed, token, step, wide_token = 5.0, 0.1, 0.6, 0.25
    timed = {0: fixed + token, 4: fixed + 5 * token + step, 32: fixed + 33 * token + step}
    assert fit_verify_costs(timed) == pytest.approx((fixed, token, step, 0, 0.0))
    timed[64] = timed[32] + 32 * wide_token
    fitted = fit_verify_costs(timed)
    assert fitted == pytest.approx((fixed, token, step, 32, wide_token))
    costs = CostModel(0.0, 0.0, *fitted[:2], 0.0, verify_draft_s=fitted[2], verify_wide=32, verify_wide_token_s=0.25)
    assert costs.round_s(PLAIN_STEP) == pytest.approx(timed[0])
    assert costs.round_s(RoundSetting(1, 1, 4)) == pytest.approx(timed[4])
    assert costs.round_s(RoundSetting(4, 1, 8)) == pytest.approx(timed[32])
    assert costs.round_s(RoundSetting(8, 1, 8)) == pytest.approx(timed[64])
    assert costs.round_s(RoundSetting(6, 1, 8)) == pytest.approx(timed[32] + 16 * wide_token)


def test_calibration_times_its_stages_in_turns_after_their_setups():
    """Every turn runs each stage once, right after its setup; the first turn is a warm-up; medians per stage. Timed
    in turns, a machine slowing down midway shifts every stage alike (the clock here: each run's cost, doubled from
    the third turn on)."""
    log, now = [], [0.0]

    class Clock:
        def now(self):
            return now[0]

    def stage(name, cost):
        def run():
            log.append(name)
            now[0] += cost * (2 if log.count(name) > 2 else 1)

        return run

    stages = {"a": (stage("a", 1.0), lambda: log.append("setup")), "b": (stage("b", 3.0), None)}
    assert timed_in_turns(Clock(), stages, repeats=4) == {"a": 2.0, "b": 6.0}
    assert log == ["setup", "a", "b"] * 5


def test_a_masked_drafter_declares_the_forwards_and_positions_it_runs(llama):
    """All K rows start as [root, MASK x L], so the first denoise step runs one row for all of them: a round's
    drafter forwards and their positions (rows x (L + 1)), counted on the drafter's first layer, are what it declares
    to the controller. A tree refines one row at every step: at T = 1, the only T auto picks, the same work."""
    models, prompts = llama
    shapes = []
    hook = models.drafter.model.layers[0].register_forward_hook(lambda _m, args, _out: shapes.append(args[0].shape))
    try:
        for k, t, block in ((4, 1, 6), (4, 2, 6), (2, 3, 4), (1, 2, 8)):
            for diversity in ("branch-first", "tree"):
                cfg = DecodeConfig(drafts=k, steps=t, block=block, diversity=diversity, max_new_tokens=16)
                for event in decode(models, prompts[0], cfg):
                    if isinstance(event, RoundTrace) and event.index > 0:
                        positions = sum(rows * span for rows, span, _ in shapes)
                        work = (len(shapes), positions)
                        if diversity == "tree":
                            assert all(s[0] == 1 for s in shapes) and work == (t, t * (block + 1)), (k, t, shapes)
                        if diversity == "branch-first" or t == 1:
                            assert work == models.drafter.draft_work(RoundSetting(k, t, block))
                        assert shapes[0][0] == 1 and all(s[0] == cfg.drafts for s in shapes[1:] if diversity != "tree")
                    shapes.clear()
    finally:
        hook.remove()
    assert models.drafter.draft_work(RoundSetting(4, 1, 8)) == models.drafter.draft_work(RoundSetting(1, 1, 8))


def test_draft_costs_are_fitted_from_drafts_of_different_work():
    """The calibration drafts tell a forward's cost from a position's for every family's declared work: exact
    seconds give back the costs they were made of; a fit below zero keeps the other cost alone."""
    families = (
        lambda s: MaskedDiffusionDrafter.draft_work(None, s),  # the first step on one row
        denoise_work,  # every step on K rows (the gaussian drafter)
        lambda s: (s.block, s.block * s.drafts),  # autoregressive: L forwards over K rows
    )
    for work in families:
        for block in (8, 5, 2):
            drafts = calibration_drafts(block)
            seconds = {s: 2e-3 * work(s)[0] + 5e-5 * work(s)[1] for s in drafts}
            assert fit_draft_costs(work, seconds) == pytest.approx((2e-3, 5e-5))
    drafts = calibration_drafts(8)
    work = families[0]
    shrinking = {s: 3e-3 * work(s)[0] - 1e-5 * work(s)[1] for s in drafts}  # more positions, less time: noise
    forward, position = fit_draft_costs(work, shrinking)
    assert position == 0.0 and forward > 0


def expected_draft_tokens(control: AutoControl, setting: RoundSetting) -> float:
    """sum over i <= L of q_1 ... q_i, from the controller's acceptance estimates (checked on known numbers above)."""
    return sum(math.prod(control.acceptance((setting.drafts, setting.steps))[:i]) for i in range(1, setting.block + 1))


def test_estimates_that_overpromise_are_discounted_by_what_tried_settings_delivered():
    """The share of expected draft tokens that drafting rounds delivered, counted (decayed like the acceptance, over a
    prior of 2 tokens at par) only for rounds whose pair had rounds of its own: an untried pair is the priors' guess.
    The share scales every setting's expected draft tokens in the rate the search maximises."""
    control = AutoControl(CostModel(0.1, 0.0, 1.0, 0.0, 0.0), max_block=8)  # drafting costs little
    first = control.choose(remaining=100)
    control.observe(first, 2, (2,) * first.drafts)
    assert control.realised_share() == 1.0  # an untried pair: not counted
    second = control.choose(remaining=100)
    expects = expected_draft_tokens(control, second)
    assert second == first and expects > 2
    control.observe(second, 1, (1,) * second.drafts)
    assert control.realised_share() == pytest.approx(3 / (expects + 2))
    third = control.choose(remaining=100)
    expects_third = expected_draft_tokens(control, third)
    control.observe(third, 0, (0,) * third.drafts)
    share = (MEMORY * 1 + 2) / (MEMORY * expects + expects_third + 2)
    assert control.realised_share() == pytest.approx(share)
    rates = {
        RoundSetting(k, 1, block): (1 + share * expected_draft_tokens(control, RoundSetting(k, 1, block)))
        / control.costs.round_s(RoundSetting(k, 1, block))
        for k in counting.AUTO_DRAFTS
        for block in range(1, 9)
    }
    best = control.search(8)
    assert best.setting == max(rates, key=rates.get) and best.rate == pytest.approx(max(rates.values()))


def test_plain_steps_when_drafting_does_not_pay_with_probes_that_back_off():
    control = AutoControl(CostModel(1.0, 0.0, 1.0, 0.0, 0.0), max_block=8)  # a draft costs a plain step
    for _ in range(3):
        control.observe(RoundSetting(1, 1, 8), 0)
    picks = []
    for _ in range(60):
        setting = control.choose(remaining=100)
        picks.append(setting)
        control.observe(setting, 0, (0,) * setting.drafts)
    drafted = [i for i, s in enumerate(picks) if not s.plain]
    # One draft failed thrice; eight untried drafts are worth one round (their prior grows with sqrt(K), the drafts
    # are not independent guesses), and when they fail too: plain steps, with probes after 16 and 32 of them.
    assert picks[0] == RoundSetting(8, 1, 8) and drafted == [0, 17, 50]
    assert control.probe_after == min(64, LAST_PROBE)
    assert control.choose(remaining=1) == PLAIN_STEP  # one token left: nothing to draft


def test_auto_greedy_equals_generate_token_for_token(llama):
    models, prompts = llama
    measured = calibrated(models)
    assert measured.costs.verify_forward_s > 0 and measured.costs.verify_token_s >= 0
    for prompt_ids in prompts:
        for with_costs, costs in ((models, COSTS), (measured, None), (models, None)):  # fixed, calibrated, per request
            traces, result = run(with_costs, prompt_ids, AUTO, costs=costs)
            assert list(result.token_ids) == hf_greedy(models, prompt_ids, new=AUTO.max_new_tokens)
            check_invariants(traces, prompt_ids.shape[1], result)
            assert [t.setting for t in traces[1:]] == list(result.settings) and len(result.settings) == result.rounds


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auto_sampling_same_seed_same_tokens_as_plain_sampling(llama, seed):
    models, prompts = llama
    plain = Models(models.target, models.tokenizer, NoDrafter())
    cfg = DecodeConfig(auto=True, temperature=0.8, top_p=0.95, seed=seed, max_new_tokens=40)
    for prompt_ids in prompts:
        _, want = run(plain, prompt_ids, DecodeConfig(temperature=0.8, top_p=0.95, seed=seed, max_new_tokens=40))
        _, got = run(models, prompt_ids, cfg, costs=COSTS)
        assert got.token_ids == want.token_ids


def test_auto_steps_plainly_when_drafts_are_always_wrong(zoo, llama):
    models, prompts = llama
    wrong = Models(models.target, models.tokenizer, ScriptedDrafter(models.target, "wrong"))
    _, result = run(wrong, prompts[0], AUTO, costs=COSTS)
    assert list(result.token_ids) == hf_greedy(models, prompts[0], new=AUTO.max_new_tokens)
    assert set(result.accept_lens) == {0}
    plain_share = sum(s == PLAIN_STEP.as_tuple() for s in result.settings) / result.rounds
    assert plain_share >= 0.85, result.settings


@pytest.mark.parametrize("script, min_drafts", [("oracle", 1), ("second", 2)])
def test_auto_drafts_long_blocks_and_as_many_drafts_as_it_takes_to_be_right(llama, script, min_drafts):
    """Drafts always right (``oracle``): long blocks; only a second draft right (``second``): K >= 2 and long blocks."""
    models, prompts = llama
    scripted = Models(models.target, models.tokenizer, ScriptedDrafter(models.target, script))
    cfg = DecodeConfig(auto=True, max_new_tokens=96)
    for prompt_ids in prompts:
        _, result = run(scripted, prompt_ids, cfg, costs=COSTS)
        assert list(result.token_ids) == hf_greedy(models, prompt_ids, new=cfg.max_new_tokens)
        late = result.settings[2 * len(result.settings) // 3 : -1]  # the last round may be cut by max_new_tokens
        assert late and all(k >= min_drafts and block >= 12 for k, _, block in late), result.settings
        assert result.tau > 6


def test_auto_choices_are_deterministic_for_a_seed_history_and_measured_times(llama, monkeypatch):
    models, prompts = llama
    for cfg in (AUTO, DecodeConfig(auto=True, temperature=0.7, seed=5, max_new_tokens=48)):
        first, second = (run(models, prompts[1], cfg, costs=COSTS)[1] for _ in range(2))
        assert first.settings == second.settings and first.token_ids == second.token_ids


def test_settings_reach_the_round_log_and_the_cli_decides_by_default(zoo, llama, tmp_path):
    models, prompts = llama
    traces, result = run(models, prompts[0], AUTO, costs=COSTS)
    write_jsonl(traces, tmp_path / "rounds.jsonl")
    records = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [(r["K"], r["T"], r["L"]) for r in records[1:]] == list(result.settings)
    assert result.to_json()["settings"] == [list(s) for s in result.settings]

    log = tmp_path / "cli.jsonl"
    args = ["generate", "--prompt", PROMPTS[0], "--chat", "--target", str(zoo["llama"]), "--drafter"]
    args += [str(zoo["drafter_llama"]), "--dtype", "float32", "--max-new-tokens", "24", "--json", "--log", str(log)]
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert out["token_ids"] == hf_greedy(models, prompts[0], new=24) and out["dtype"] == "float32"
    assert [[r["K"], r["T"], r["L"]] for r in records[1:]] == out["settings"] and len(out["settings"]) == out["rounds"]
    # auto's choice, in the output with the figures that chose it: every drafting round ran it (where it is plain
    # steps, the drafting setting its figures measured, ``ChosenControl``'s probes)
    choice = SettingChoice.from_json(out["auto_choice"], "read")
    ran = choice.worth(False).setting if choice.greedy.plain else choice.greedy
    assert (
        all(tuple(s[:2]) == ran.as_tuple()[:2] for s in out["settings"] if s[2]) and "plain" in choice.figures["greedy"]
    )
    pinned = json.loads(cli(*args, "-L", "4").stdout)
    assert pinned["settings"] == [[1, 1, 4]] * pinned["rounds"]  # one of -K/-T/-L pins the setting
    assert pinned["auto_choice"] is None
    text = cli(*args[:-3])  # without --json: the choice is said on stderr, after the reply
    summary = SettingChoice.from_json(out["auto_choice"], "cached").summary().removesuffix(" (cached)")
    assert text.returncode == 0 and f"[auto runs {summary} (cached in " in text.stderr


def test_a_choice_costs_far_less_than_a_millisecond():
    control = AutoControl(COSTS, max_block=16)
    for accepted in (3, 5, 1, 8, 2):
        control.observe(RoundSetting(2, 1, 8), accepted)
    start = time.thread_time()  # CPU time of this thread: other jobs on the machine do not count
    for i in range(200):
        setting = control.choose(remaining=100)
        control.observe(setting if not setting.plain else RoundSetting(1, 1, 4), i % 5)
    assert (time.thread_time() - start) / 200 < 0.5e-3


def test_the_none_drafter_under_auto_steps_plainly(zoo):
    models = load_models(zoo["llama"], "none", device="cpu", dtype="float32")
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    result = list(decode(models, prompt_ids, AUTO, costs=COSTS))[-1]
    assert set(result.settings) == {PLAIN_STEP.as_tuple()}
    assert list(result.token_ids) == hf_greedy(models, prompt_ids, new=AUTO.max_new_tokens)


# A plain step costs 1 s here (verify 0.9 + 0.1 per token, nothing else); a tree draft one forward over one row, 1 +
# 0.1 x 9 s at L = 8, so a (K, 1, 8) round costs 1.9 + 0.9 + 0.1 (8 K + 1): 3.7, 4.5 and 6.1 s at K = 1, 2, 4.
UNIT_COSTS = CostModel(1.0, 0.1, 0.9, 0.1, 0.0, draft_work=lambda s: (1, s.block + 1))
TREES = [RoundSetting(k, 1, 8) for k in (1, 2, 4)]


def recorded(*accepted_orders: tuple[int, ...], chances: float = 1.0) -> list[RecordedRound]:
    """Rounds of a 32-node tree (the widest candidate's, (4, 1, 8)), every node's path chance ``chances``, each round
    accepting the nodes at these places of the best-first order."""
    return [RecordedRound((chances,) * 32, orders) for orders in accepted_orders]


SURE_THREE = (0, 1, 2)  # three nodes accepted, all among the first 8: every candidate accepts them


def test_the_setting_with_the_most_hand_computed_tokens_per_second_is_chosen_a_wider_one_by_a_margin():
    """Sure nodes (path chance 1 against a node's row at 0.1 plain steps) are all verified, so a (K, 1, 8) round is
    priced 3.7, 4.5 and 6.1 s. Two rounds, one accepting its first three nodes, one nodes 0-2, 8, 9, 16 and 17 (K = 1
    keeps 3, K = 2 five, K = 4 seven): taus 4, 5, 6, and 4 / 3.7 = 1.081, 5 / 4.5 = 1.111, 6 / 6.1 = 0.984 tokens/s
    against a plain step's 1: (2, 1, 8) is the fastest but beats (1, 1, 8) by 2.8 %, under the 5 % margin: (1, 1, 8).
    Taus 4, 5.2 (five rounds: 1.156 beats 1.081 by 6.9 %): (2, 1, 8). Taus of 3.8 (1.027 over plain, under the
    margin against a plain step too): plain; taus of 3 beat no plain step: plain. A pure function of the figures."""
    rounds = recorded(SURE_THREE, (0, 1, 2, 8, 9, 16, 17))
    chosen, figures = choose_setting(rounds, TREES, UNIT_COSTS)
    assert chosen == RoundSetting(1, 1, 8)
    assert figures["2x1x8"] == {
        "tau": 5.0,
        "round_ms": pytest.approx(4500.0),
        "tokens_per_s": pytest.approx(5 / 4.5),
        "nodes": 16.0,
        "share": 8 / 32,  # eight accepted among the first 16 nodes of two rounds, each node's path chance 1
    }
    assert figures["plain"]["tokens_per_s"] == pytest.approx(1.0)
    assert choose_setting(rounds[::-1], TREES[::-1], UNIT_COSTS) == (chosen, figures)
    wide = recorded(*[SURE_THREE] * 4, (0, 1, 2, *range(8, 14), *range(16, 20)))
    wide_chosen, wide_figures = choose_setting(wide, TREES, UNIT_COSTS)
    assert [wide_figures[setting_name(s)]["tau"] for s in TREES] == pytest.approx([4.0, 5.2, 6.0])
    assert wide_chosen == RoundSetting(2, 1, 8)
    assert choose_setting(recorded(*[SURE_THREE] * 4, (0, 1)), TREES, UNIT_COSTS)[0] == PLAIN_STEP
    assert choose_setting(recorded((0, 1)), TREES, UNIT_COSTS)[0] == PLAIN_STEP
    assert choose_setting([], TREES, UNIT_COSTS)[0] == PLAIN_STEP  # nothing drafted: nothing to choose on
    assert candidate_settings(8, (1, 2)) == (*TREES, *(RoundSetting(k, 2, 8) for k in (1, 2, 4)))


def test_drafting_stands_only_where_decoding_confirms_it_beats_plain_steps_by_the_margin():
    """100 tokens in 1 s drafting against 100 in 1.05 s of plain steps: exactly the 5 % margin, kept; in 1.04 s, 4 %
    short of it: plain steps. A plain choice, or nothing timed, stays as it is."""
    tree = RoundSetting(1, 1, 8)
    assert confirmed(tree, (100, 1.0), (100, 1.05)) == tree
    assert confirmed(tree, (100, 1.0), (100, 1.04)) == PLAIN_STEP
    assert confirmed(PLAIN_STEP, (100, 1.0), (1, 1.0)) == PLAIN_STEP
    assert confirmed(tree, (0, 0.0), (100, 1.0)) == tree
    assert confirmed(tree, (100, 1.0), (0, 1.0)) == tree and speed_ratio((100, 1.0), (0, 1.0)) is None  # no plain rate


def test_a_choice_that_decodes_no_faster_than_plain_steps_is_plain_and_says_so(llama, monkeypatch):
    """The decodes that confirm a drafting choice, stood in for: drafting as fast as plain steps turns both modes'
    choices to plain steps, the summary saying what decoding measured."""
    models, _ = llama
    asked = []

    def level(models, sampled, setting, costs, share):
        asked.append((sampled, setting))
        return [(100, 1.0), (100, 1.0)]

    monkeypatch.setattr(engine, "decoded_in_turns", level)
    choice = calibrate(models).chosen
    assert asked and (choice.greedy, choice.sampled) == (PLAIN_STEP, PLAIN_STEP)
    for sampled, setting in asked:
        mode = "sampled" if sampled else "greedy"
        assert choice.figures[mode][setting_name(setting)]["decoded_over_plain"] == 1.0
        assert f"{setting_name(setting)} where a request's own rounds pay (tau" in choice.summary()
        assert "1.00x decoded" in choice.summary()


def test_a_tree_verifies_the_best_first_nodes_whose_chances_pay_for_their_rows():
    """At the unit costs a node's row costs 0.1 plain steps: path chances 0.9, 0.5, 0.3, 0.15, 0.05 gain 0.8, 1.2,
    1.4, 1.45 and 1.4 tokens over their price with 1-5 nodes, so four (0.15 pays for its row, 0.05 does not). A
    forward over drafts that costs 0.5 more than a plain step (``verify_draft_s``) takes 0.5 from every count but
    none: still four; but chances 0.3, 0.1 then gain -0.3 and -0.4, under a plain step's 0: none."""
    chances = [0.9, 0.5, 0.3, 0.15, 0.05]
    assert nodes_worth_verifying(chances, UNIT_COSTS) == 4
    stepped = replace(UNIT_COSTS, verify_draft_s=0.5)
    assert nodes_worth_verifying(chances, stepped) == 4
    assert nodes_worth_verifying([0.3, 0.1], stepped) == 0
    assert nodes_worth_verifying([], UNIT_COSTS) == 0
    assert nodes_worth_verifying([1.0] * 32, UNIT_COSTS) == 32
    # Chances worth twice what they say (``chance_share``): 0.6 and 0.2 gain 0.0 and 0.1 over a plain step, so two;
    # and no node counts for more than one token.
    assert nodes_worth_verifying([0.3, 0.1], stepped, share=2.0) == 2
    assert nodes_worth_verifying([0.9, 0.05], UNIT_COSTS, share=2.0) == 1
    assert chance_share(recorded(SURE_THREE, (0, 1, 2, 8, 9, 16, 17)), 8) == pytest.approx(6 / 16)
    assert chance_share(recorded(SURE_THREE, (0, 1, 2, 8, 9, 16, 17)), 32) == pytest.approx(10 / 64)
    assert chance_share([], 8) == 1.0
    # A tree's path chances: each node's own chances multiplied along its path, best first, a shared node once.
    assert path_chances([(0, 1, 3), (0, 2)], [(0.9, 0.8, 0.5), (0.9, 0.6)]) == pytest.approx([0.9, 0.72, 0.54, 0.36])
    # The replay counts the accepted nodes it verified only, and prices the cut: path chances of 0.05 verify none (a
    # plain step after a (1, 1, 8) draft: 1.9 + 1 s) and accept none.
    assert replayed(recorded(SURE_THREE, chances=0.05), TREES[0], UNIT_COSTS) == (1, pytest.approx(2.9), 0)


def test_auto_cuts_a_drafted_tree_to_its_paying_nodes_and_a_pinned_setting_verifies_all():
    """Two paths sharing their first node, path chances 0.9, 0.72, 0.54 and 0.36 best first; a node's row priced 0.5
    plain steps: gains 0.4, 0.62, 0.66, 0.52 with 1-4 nodes, so the first three: the first path keeps its first two
    tokens, the second both. First chances of 0.05 keep none: the root alone, a plain step."""
    drafts = Drafts(((10, 11, 12), (10, 20)), order=((0, 1, 3), (0, 2)), chances=((0.9, 0.8, 0.5), (0.9, 0.6)))
    costs = replace(UNIT_COSTS, verify_forward_s=0.5, verify_token_s=0.5)
    cut = ChosenControl(TREES[0], costs).to_verify(drafts)
    assert cut == replace(drafts, tokens=((10, 11), (10, 20)), order=((0, 1), (0, 2)), chances=((0.9, 0.8), (0.9, 0.6)))
    # Watched, the step that shows the tree shows the part verified (the panel's last frame), an earlier one as it was.
    earlier = DenoiseStep(((10, MASKED, MASKED),), ((0.9, 0.1, 0.1),))
    watched = replace(drafts, steps=(earlier, DenoiseStep(drafts.tokens, drafts.chances, kind="tree")))
    shown = ChosenControl(TREES[0], costs).to_verify(watched).steps
    assert shown == (earlier, DenoiseStep(cut.tokens, cut.chances, kind="tree"))
    unsure = replace(drafts, chances=((0.05, 0.5, 0.5), (0.05, 0.5)))
    assert ChosenControl(TREES[0], costs).to_verify(unsure).tokens == ()
    assert ChosenControl(TREES[0]).to_verify(unsure) == unsure  # no prices: nothing cut
    assert FixedControl(DecodeConfig(drafts=2, block=3)).to_verify(unsure) == unsure


def test_auto_equals_generate_where_it_verifies_part_of_its_trees(embedded):
    """The embedded pair (a trained drafter's chances) at prices that make a node's row cost a quarter of a plain
    step: auto verifies part of its (2, 1, 4) trees in some rounds, and its tokens are still ``generate``'s, greedy;
    the same seed gives the same tokens at 0.7."""
    chosen = SettingChoice(RoundSetting(2, 1, 4), RoundSetting(2, 1, 4), {"greedy": {}, "sampled": {}})
    costs = CostModel(1e-3, 1e-4, 3e-3, 1e-3, 0.0, chosen=chosen)
    sizes = []
    for text in PROMPTS[:3]:
        prompt_ids = encode_prompt(embedded.tokenizer, text, chat=True)
        events, result = run(embedded, prompt_ids, AUTO, costs=costs)
        sizes += [e.tree_size for e in events if e.index]
        assert list(result.token_ids) == hf_greedy(embedded, prompt_ids, new=AUTO.max_new_tokens)
    assert any(0 < n < 8 for n in sizes), sizes
    # The greedy choice's chances are worth their measured share in its rounds; the sampled plain steps cut nothing.
    figures = {"greedy": {"2x1x4": {"share": 1.7}}, "sampled": {}}
    measured = replace(costs, chosen=SettingChoice(RoundSetting(2, 1, 4), PLAIN_STEP, figures))
    assert control(embedded, AUTO, measured).share == 1.7
    assert control(embedded, replace(AUTO, temperature=0.7), measured).share == 1.0
    sampled = DecodeConfig(auto=True, temperature=0.7, seed=5, max_new_tokens=32)
    first, second = (run(embedded, prompt_ids, sampled, costs=costs)[1] for _ in range(2))
    assert first.token_ids == second.token_ids


def test_the_choice_says_what_auto_runs_in_its_figures_terms_and_where_plain_steps_won_what_lost():
    """The summary the CLI, the bench and the app show: taus 4, 5, 6 at the unit costs above choose (1, 1, 8), 4
    tokens a round of 3.7 plain steps (1.08x); taus of 3 choose plain steps, probing with the best drafting setting
    (1, 1, 8) at 3 / 3.7 = 0.81x."""
    greedy, greedy_figures = choose_setting(recorded(SURE_THREE, (0, 1, 2, 8, 9, 16, 17)), TREES, UNIT_COSTS)
    sampled, sampled_figures = choose_setting(recorded((0, 1)), TREES, UNIT_COSTS)
    choice = SettingChoice(greedy, sampled, {"greedy": greedy_figures, "sampled": sampled_figures}, "measured here")
    assert choice.summary() == (
        "greedy 1x1x8 (tau 4.00 a round of 3.70 plain steps, 1.08x plain decoding expected); sampled plain steps, "
        "drafting 1x1x8 where a request's own rounds pay (tau 3.00 a round of 3.70 plain steps, 0.81x plain decoding "
        "expected) (measured here)"
    )
    assert SettingChoice(greedy, sampled, {}, "cached").summary() == "greedy 1x1x8; sampled plain (cached)"


def test_auto_keeps_the_chosen_setting_whatever_a_round_accepted():
    control, chain = ChosenControl(TREES[0]), TREES[0]
    picked = []
    for accepted in [0, 0, 0, 0, 0, 5, 0]:  # rounds that accepted nothing do not stop it drafting
        picked.append(control.choose(remaining=100))
        control.observe(picked[-1], accepted)
    assert picked == [chain] * 7
    assert control.choose(remaining=4) == RoundSetting(1, 1, 3)  # no draft past the reply's end
    assert control.choose(remaining=1) == PLAIN_STEP
    assert ChosenControl(RoundSetting(1, 2, 8)).choose(remaining=2) == RoundSetting(1, 1, 1)  # no more steps than L
    assert ChosenControl(PLAIN_STEP).choose(remaining=100) == PLAIN_STEP


def test_where_drafting_was_turned_down_a_request_probes_and_drafts_while_its_own_rounds_pay(monkeypatch):
    """A (1, 1, 8) round priced 3.7 plain steps (UNIT_COSTS), measured at load at tau 2.96: 0.8x plain steps. Counted
    as 4 rounds with a request's own: a first-round probe accepting nothing reads (1 + 4 x 2.96) / (3.7 + 4 x 3.7) =
    0.694x, and plain steps follow, probes after 16, 32 and 64 of them, then every 64. A probe accepting 7 reads
    (8 + 11.84) / 18.5 = 1.072x, over the 5 % margin: drafting goes on; one round accepting nothing after it reads
    (9 + 11.84) / 22.2 = 0.939x: plain steps again; after two rounds accepting 7, two rounds accepting nothing."""
    monkeypatch.setattr(controller, "REQUEST_PRIOR", 4.0)
    chain = TREES[0]
    worth = DraftingWorth(chain, share=1.0, tau=2.96, steps=3.7, bias=1.0)
    assert worth.rate(0.0, 0.0) == pytest.approx(0.8) and worth.rate(8, 3.7) == pytest.approx(19.84 / 18.5)

    def picks(accepted):
        control, chosen = ChosenControl(chain, UNIT_COSTS, worth=worth), []
        for got in accepted:
            chosen.append(control.choose(remaining=1000))
            control.observe(chosen[-1], got if chosen[-1] == chain else 0)
        return chosen

    assert (FIRST_PROBE, LAST_PROBE) == (16, 64)
    gaps = [16, 32, 64, 64]
    want = [chain] + [x for gap in gaps for x in [PLAIN_STEP] * gap + [chain]]
    assert picks([0] * len(want)) == want
    assert picks([7, 7, 0, 0, 0]) == [chain] * 4 + [PLAIN_STEP]  # 1.072x, 1.254x, 1.114x, then 1.008x
    assert picks([7, 0, 0]) == [chain, chain, PLAIN_STEP]
    # Its price: a round verifying part of its tree costs its draft and that verify; none, its draft and a plain step.
    control = ChosenControl(chain, UNIT_COSTS, worth=worth)
    control.verified = 3
    control.observe(chain, 2)
    control.verified = 0
    control.observe(chain, 0)
    assert (control.tokens, control.steps) == (4, pytest.approx((1.9 + 1.3) + (1.9 + 1.0)))


def test_the_measured_worth_of_each_mode_is_the_drafting_setting_its_figures_speak_for():
    """Where a mode drafts, its setting; where plain steps won, the one decoding turned down, else the best replayed;
    the bias is the decoded rate over the expected one (1 where nothing was decoded)."""
    plain = {"tau": 1.0, "round_ms": 10.0, "tokens_per_s": 100.0}
    one = {"tau": 2.0, "round_ms": 25.0, "tokens_per_s": 80.0, "share": 0.5}
    two = {"tau": 2.7, "round_ms": 30.0, "tokens_per_s": 90.0, "share": 0.6}
    turned_down = one | {"decoded_over_plain": 0.72}
    figures = {
        "greedy": {"plain": plain, "1x1x8": one, "2x1x8": two},
        "sampled": {"plain": plain, "1x1x8": turned_down},
    }
    choice = SettingChoice(PLAIN_STEP, PLAIN_STEP, figures)
    assert choice.worth(False) == DraftingWorth(RoundSetting(2, 1, 8), 0.6, 2.7, 3.0, 1.0)
    assert choice.worth(True) == DraftingWorth(RoundSetting(1, 1, 8), 0.5, 2.0, 2.5, pytest.approx(0.9))
    drafting = SettingChoice(RoundSetting(1, 1, 8), PLAIN_STEP, figures)
    assert drafting.worth(False).setting == RoundSetting(1, 1, 8)
    assert SettingChoice(PLAIN_STEP, PLAIN_STEP, {}).worth(True) is None


def test_auto_that_chose_plain_steps_probes_and_its_tokens_stay_the_targets(embedded):
    """The embedded pair with plain steps chosen both ways and a drafting setting measured at 0.8x: auto's requests
    draft their first round and probes after plain runs, rounds of both kinds; greedy its tokens are ``generate``'s,
    and sampled, plain sampling's with the same seed. A mode that drafts keeps drafting whatever its rounds accept."""
    plain = {"tau": 1.0, "round_ms": 4.0, "tokens_per_s": 250.0}
    chain = {"tau": 2.8, "round_ms": 14.0, "tokens_per_s": 200.0, "share": 1.0}
    figures = {mode: {"plain": plain, "1x1x4": chain} for mode in ("greedy", "sampled")}
    costs = CostModel(1e-3, 1e-4, 3e-3, 1e-3, 0.0, chosen=SettingChoice(PLAIN_STEP, PLAIN_STEP, figures))
    cut_off = Models(embedded.target, embedded.tokenizer, NoDrafter())
    for text in PROMPTS[:2]:
        prompt_ids = encode_prompt(embedded.tokenizer, text, chat=True)
        _, result = run(embedded, prompt_ids, AUTO, costs=costs)
        drafted = [i for i, s in enumerate(result.settings) if s != PLAIN_STEP.as_tuple()]
        assert drafted[0] == 0 and 0 < len(drafted) < len(result.settings), result.settings
        assert list(result.token_ids) == hf_greedy(embedded, prompt_ids, new=AUTO.max_new_tokens)
        sampled = DecodeConfig(auto=True, temperature=0.7, seed=4, max_new_tokens=AUTO.max_new_tokens)
        _, got = run(embedded, prompt_ids, sampled, costs=costs)
        _, want = run(cut_off, prompt_ids, replace(sampled, auto=False))
        assert got.token_ids == want.token_ids
    drafting = replace(costs, chosen=SettingChoice(RoundSetting(1, 1, 4), PLAIN_STEP, figures))
    assert control(embedded, AUTO, drafting).worth is None
    assert control(embedded, replace(AUTO, temperature=0.7), drafting).worth.setting == RoundSetting(1, 1, 4)


def test_auto_runs_the_setting_chosen_at_load_and_equals_generate(llama):
    models, prompts = llama
    figures = {"greedy": {}, "sampled": {}}
    costs = replace(COSTS, chosen=SettingChoice(RoundSetting(2, 1, 4), RoundSetting(1, 1, 4), figures))
    for cfg in (AUTO, DecodeConfig(auto=True, temperature=0.7, seed=3, max_new_tokens=48)):
        for prompt_ids in prompts:
            _, result = run(models, prompt_ids, cfg, costs=costs)
            chosen = costs.chosen.setting(not cfg.greedy)
            # every round at the chosen setting, its block cut only where the reply ends sooner
            drafted = [s for s in result.settings if s != PLAIN_STEP.as_tuple()]
            assert drafted and all(s[:2] == chosen.as_tuple()[:2] and 1 <= s[2] <= chosen.block for s in drafted)
            assert all(s == chosen.as_tuple() for s in result.settings[: -chosen.block])
            if cfg.greedy:
                assert list(result.token_ids) == hf_greedy(models, prompt_ids, new=cfg.max_new_tokens)


def test_the_choice_is_measured_once_per_machine_threads_and_models_and_cached_with_its_figures(llama, monkeypatch):
    models, _ = llama
    calls, recordings = [], {}
    recorded_rounds = engine.recorded_rounds

    def counted(models, sampled, widest):
        calls.append(sampled)
        recordings[sampled] = recorded_rounds(models, sampled, widest)
        return recordings[sampled]

    monkeypatch.setattr(engine, "recorded_rounds", counted)
    costs = calibrate(models)
    first = costs.chosen
    assert calls == [False, True] and first.reason.startswith("measured at load")
    candidates = candidate_settings(models.drafter.max_block, CHOSEN_STEPS)
    for mode in ("greedy", "sampled"):
        taus = {s: first.figures[mode][setting_name(s)]["tau"] for s in candidates}
        assert taus[candidates[0]] <= taus[candidates[1]] <= taus[candidates[2]]  # nested trees: more nodes, more kept
        rounds = recordings[mode == "sampled"]
        assert rounds and all(len(r.chances) == candidates[-1].nodes for r in rounds)
        replayed_choice = choose_setting(rounds, candidates, costs)[0]
        decoded = first.figures[mode].get(setting_name(replayed_choice), {}).get("decoded_over_plain")
        # Drafting stands where it also decoded the requests faster than plain steps by the margin (``confirmed``)
        assert (decoded is None) == replayed_choice.plain
        kept = replayed_choice if decoded is None or decoded >= SPECULATE_MARGIN else PLAIN_STEP
        assert first.setting(mode == "sampled") == kept
        chosen = first.setting(mode == "sampled")
        share = 1.0 if chosen == PLAIN_STEP else chance_share(rounds, chosen.nodes)
        assert first.share(mode == "sampled") == pytest.approx(share)  # what auto's rounds then cut with
    again = calibrate(models).chosen
    assert len(calls) == 2 and again.reason.startswith("cached in") and again.figures == first.figures
    assert (again.greedy, again.sampled) == (first.greedy, first.sampled)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        calibrate(models)  # another thread count: measured again
    finally:
        torch.set_num_threads(threads)
    assert len(calls) == 4
    entry = json.loads((hub.cache_folder() / engine.SETTING_CACHE).read_text())
    assert len(entry) == 2


def test_the_engine_hands_each_round_s_measured_times_to_the_control(llama, monkeypatch):
    models, prompts = llama
    took = []
    for kind in (ChosenControl, AutoControl):
        monkeypatch.setattr(kind, "timed", lambda self, measured: took.append(measured))
    events = [e for e in decode(models, prompts[0], AUTO, costs=COSTS) if isinstance(e, RoundTrace) and e.index]
    assert [(t.draft_s, t.verify_s, t.other_s) for t in took] == [(e.draft_s, e.verify_s, e.other_s) for e in events]
