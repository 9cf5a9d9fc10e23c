"""The app in a real browser: Debian's chromium driven by playwright against ``python app.py`` on the tiny models.

A user's session: send a message and watch it stream with the four panels drawn; move the drafts slider, race plain
decoding and send again; scrub the rounds; stop a generation midway and go on chatting; run a (K, T) sweep in the
Sweep tab, stop one, and ask for an empty one. Reply statistics shown on the
page are compared with the engine run directly. Screenshots go to test-output/.

Skips when chromium or playwright is missing, unless XPRESS_REQUIRE_BROWSER=1 (CI), where that is a failure.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict

import pytest

from tests.app_browser import (
    BOT,
    open_app,
    open_page,
    require_browser,
    send,
    set_checkbox,
    set_number,
    start_fresh,
    status,
    svg_text,
    wait_done,
)
from tests.app_server import OUTPUT, serve_app, zoo_env
from xpress_app.settings import DEFAULTS
from xpress_app.sweep import CHAT_BOX
from xpress_app.texts import EXAMPLES
from xpress_core.bench import measure as bench_measure
from xpress_core.bench.methods import XPRESS
from xpress_core.config import DecodeConfig
from xpress_core.engine import decode
from xpress_core.models import encode_prompt, load_models
from xpress_core.models import native_bf16 as cpu_native_bf16  # imported before conftest hides the CPU's answer
from xpress_core.plots import MAX_ROWS

pytestmark = pytest.mark.browser

PLOTS = ("plot-evolution", "plot-accept", "plot-latency", "plot-provenance")


@pytest.fixture(scope="module")
def page(zoo):
    require_browser()
    from playwright.sync_api import sync_playwright

    with serve_app(zoo_env(zoo), "app-browser") as url, sync_playwright() as playwright:
        browser, page = open_app(playwright, url)
        yield page
        browser.close()


@pytest.fixture(scope="module")
def models(zoo):
    """The tiny pair as the app's server loads it (fp32 by ``zoo_env``; beside it the drafter in bf16 where this CPU
    computes bf16 natively, ``models.drafter_dtype``, which the tests' own process otherwise hides): its drafts, and
    so its rounds, are the server's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("xpress_core.models.dtypes.native_bf16", cpu_native_bf16)
        return load_models(zoo["llama"], zoo["drafter_llama"], device="cpu", dtype="float32")


def engine_events(models, message: str | list[dict], **changes):
    """The engine's rounds and result for a message (or a whole conversation) with the app's default settings and
    ``changes``."""
    # Pinned (K, T, L): greedy, auto's reply has the same tokens, in rounds that depend on measured costs.
    cfg = DecodeConfig.from_mapping({**asdict(DEFAULTS), "auto": False, **changes})
    events = list(decode(models, encode_prompt(models.tokenizer, message, chat=True), cfg))
    return events[:-1], events[-1]


def engine_result(models, message: str | list[dict], **changes):
    return engine_events(models, message, **changes)[1]


def shows_rows_of(evolution: str, trace) -> bool:
    """The draft panel holds one row per draft of the round (a tree's drafts are its paths), and no more; past
    ``MAX_ROWS`` it says how many it left out."""
    rows = len(trace.drafts)
    if rows > MAX_ROWS:
        return f"{rows - MAX_ROWS} more drafts not shown" in evolution and f"draft {rows + 1}" not in evolution
    return f"draft {rows}" in evolution and f"draft {rows + 1}" not in evolution


def screenshot(page, name: str) -> None:
    OUTPUT.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUT / name), full_page=True)


def start_pinned(page) -> None:
    """An empty chat with Auto off: each test on the shared page compares its rounds with the engine's at pinned
    K, T, L, whichever tests ran before it (or none)."""
    start_fresh(page)
    set_checkbox(page, "auto", False)


def inside(box: dict, width: int, height: int) -> bool:
    return box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= width and box["y"] + box["height"] <= height


def test_a_reply_streams_in_and_the_four_panels_draw_it(page, models):
    start_pinned(page)  # the pinned defaults K, T, L: the rounds are the engine's own run's
    set_checkbox(page, "animate", True)  # a frame per denoise step: the stream is slow enough to watch
    set_number(page, "max-new-tokens", 12)
    page.evaluate("""() => {
        window.replyLengths = [];
        new MutationObserver(() => {
            const bots = document.querySelectorAll("#chatbot [data-testid='bot']");
            if (bots.length) window.replyLengths.push(bots[bots.length - 1].innerText.length);
        }).observe(document.querySelector('#chatbot'), {subtree: true, childList: true, characterData: true});
    }""")
    send(page, "I want to book a table")
    done = wait_done(page)
    traces, expected = engine_events(models, "I want to book a table", max_new_tokens=12)
    assert done and (int(done[1]), int(done[2]), done[3]) == (
        expected.new_tokens,
        expected.rounds,
        f"{expected.tau:.2f}",
    )
    # The first reply loaded the models: block L is capped at the tiny drafter's trained block size.
    page.wait_for_function("document.querySelector('#block input[type=range]').max === '8'")
    lengths = [n for n in page.evaluate("window.replyLengths") if n > 0]
    assert len(set(lengths)) >= 3, f"the reply did not stream: lengths seen {lengths}"
    assert page.input_value("#message textarea") == ""
    for plot in PLOTS:
        assert page.locator(f"#{plot} .js-plotly-plot .main-svg").count() >= 1, f"{plot} was not drawn"
    evolution = svg_text(page, "plot-evolution")
    assert f"round {expected.rounds} · denoise step {DEFAULTS.steps}/{DEFAULTS.steps}" in evolution
    assert shows_rows_of(evolution, traces[-1])
    assert f"τ = {expected.tau:.2f}" in svg_text(page, "plot-accept")
    assert "tokens came from accepted drafts" in svg_text(page, "plot-provenance")
    with page.expect_download() as download:
        page.click("#download-log")
    records = [json.loads(line) for line in download.value.path().read_text().splitlines()]
    assert [r["round"] for r in records] == list(range(expected.rounds + 1))
    assert [r["accept_len"] for r in records[1:]] == list(expected.accept_lens)
    screenshot(page, "browser-1-reply.png")


VERDICT = re.compile(
    r"τ ([\d.]+) × \(1 / ([\d.]+) plain steps per round\) → ([\d.]+)× .* · a round = draft ([\d.]+) \+ "
    r"verify ([\d.]+) \+ other ([\d.]+) plain steps of ([\d.]+) ms · break-even τ ([\d.]+)"
)
FIRST_SCREEN = ("chatbot", "verdict", "plot-evolution", "round-slider", "step-slider")


@pytest.mark.parametrize("width,height", [(1440, 900), (1280, 720)])
def test_after_an_example_reply_the_first_screen_shows_chat_drafts_and_the_engines_verdict(page, models, width, height):
    screen = open_page(page.context.browser, page.url, width, height)  # a new visitor
    # The page as it settles: the preset note, filled when the page has loaded, moves what is below it. Clicked
    # before, the button may be out of view for an instant and playwright scrolls to it (seen on a busy machine).
    screen.wait_for_function("document.querySelector('#preset-note').innerText.trim().length > 0")
    label, text = next(iter(EXAMPLES.items()))
    button = screen.get_by_role("button", name=label)
    assert inside(button.bounding_box(), width, height), "the example buttons are not on the first screen"
    button.click()  # one click sends it
    done = wait_done(screen)
    assert screen.inner_text("#chatbot [data-testid='user']").strip() == text
    screen.wait_for_timeout(1000)  # the last Plotly redraws
    assert screen.evaluate("window.scrollY") == 0
    for elem_id in FIRST_SCREEN:
        box = screen.locator(f"#{elem_id}").bounding_box()
        assert inside(box, width, height), f"#{elem_id} at {box} is not inside the first {width}x{height} screen"
    screen.screenshot(path=str(OUTPUT / f"browser-first-screen-{width}x{height}.png"))

    expected = engine_result(models, text)  # the tokens; auto picked the rounds' settings
    with screen.expect_download() as download:
        screen.click("#download-log")
    rounds = [json.loads(line) for line in download.value.path().read_text().splitlines()][1:]  # 0: the prefill
    log_tau = sum(r["accept_len"] + 1 for r in rounds) / len(rounds)
    assert [t for r in rounds for t in r["emitted_tokens"]] == list(expected.token_ids)[1:]  # the prefill's first
    assert (int(done[1]), int(done[2]), done[3]) == (expected.new_tokens, len(rounds), f"{log_tau:.2f}")
    used = Counter("plain step" if r["L"] == 0 else f"K={r['K']} T={r['T']} L={r['L']}" for r in rounds)
    assert all(f"{label} × {n}" in status(screen) for label, n in used.items())  # the settings Auto chose
    # The verdict's numbers are the reply's own: τ and the stages from its round log, over the plain step shown.
    shown = VERDICT.search(screen.inner_text("#verdict"))
    assert shown, screen.inner_text("#verdict")
    assert screen.inner_text("#verdict").startswith("whole reply (prefill ")  # the whole reply first, then per round
    assert shown[1] == f"{log_tau:.2f}"
    per_round, speedup, *stages, step_ms, break_even = (float(x) for x in shown.groups()[1:])
    within = {"rel": 2e-3, "abs": 0.006}  # the page rounds to 2 decimals, the plain step to 3 (in ms)
    for stage, steps in zip(("draft", "verify", "other"), stages):
        ms = 1000 * sum(r[f"{stage}_time"] for r in rounds) / len(rounds)
        assert steps == pytest.approx(ms / step_ms, **within), stage
    exact = 1000 * sum(r["draft_time"] + r["verify_time"] + r["other_time"] for r in rounds) / len(rounds) / step_ms
    assert per_round == break_even == pytest.approx(exact, **within)
    assert speedup == pytest.approx(log_tau / exact, **within)
    screen.close()


def test_more_drafts_and_a_race_then_scrubbing_the_rounds(page, models):
    start_pinned(page)
    set_checkbox(page, "animate", False)
    set_number(page, "max-new-tokens", 40)
    drafts = page.locator("#drafts input[type=range]")
    drafts.focus()
    start = int(drafts.input_value())
    for _ in range(abs(6 - start)):  # the keyboard moves a slider the way a user's arrow keys do
        drafts.press("ArrowRight" if start < 6 else "ArrowLeft")
    assert page.input_value("#drafts input[type=number]") == "6"
    set_number(page, "steps", 2)
    set_checkbox(page, "race", True)
    page.wait_for_selector("#plain-reply", state="visible")
    send(page, "Please find me a flight")
    done = wait_done(page)
    traces, expected = engine_events(models, "Please find me a flight", drafts=6, steps=2, max_new_tokens=40)
    assert (int(done[1]), int(done[2])) == (expected.new_tokens, expected.rounds)
    page.wait_for_function("document.querySelector('#status').innerText.includes('same tokens ✓')")
    assert "Race (measured, prefill included) · plain decoding" in status(page)
    assert "agrees with the verdict's whole reply" in status(page) or "not a fair measurement" in status(page)
    assert page.input_value("#plain-reply textarea").strip()
    evolution = svg_text(page, "plot-evolution")
    assert shows_rows_of(evolution, traces[-1]) and len(traces[-1].drafts) > 1
    assert re.search(r"tokens/s: speculative [\d.]+ · plain [\d.]+", svg_text(page, "plot-latency"))
    screenshot(page, "browser-2-race-6-drafts.png")

    rounds = page.locator("#round-slider input[type=range]")
    assert rounds.get_attribute("max") == str(expected.rounds)
    rounds.focus()
    rounds.press("Home")  # round 0: the prefill
    page.wait_for_function("document.querySelector('#plot-evolution').textContent.includes('prefill')")
    rounds.press("ArrowRight")
    page.wait_for_function("document.querySelector('#plot-evolution').textContent.includes('round 1 · denoise')")
    steps = page.locator("#step-slider input[type=range]")
    steps.focus()
    steps.press("Home")
    page.wait_for_function(
        "document.querySelector('#plot-evolution').textContent.includes('round 1 · denoise step 1/2')"
    )
    assert "MASK" in svg_text(page, "plot-evolution")  # half the block is still masked after step 1 of 2
    set_checkbox(page, "race", False)


def test_stop_midway_keeps_the_partial_reply_and_clear_empties_the_chat(page, models):
    start_pinned(page)
    set_checkbox(page, "animate", True)
    set_number(page, "max-new-tokens", 300)
    send(page, "Once upon a time")
    page.wait_for_function("/… round ([3-9]|\\d\\d)/.test(document.querySelector('#status').innerText)")
    # While animating, the draft panel beside the buttons redraws five times a second: on a busy machine the browser
    # may never show playwright the idle frame a click waits for, before or after it (a forced click still timed out
    # after clicking, waiting for navigations), so the click event goes to the button as it stands.
    page.dispatch_event("#stop", "click")
    page.wait_for_function("document.querySelector('#status').innerText.includes('Stopped after')")
    stopped = int(re.search(r"Stopped after (\d+) tokens", status(page))[1])
    assert 0 < stopped < 300
    partial = page.inner_text(BOT)
    page.wait_for_timeout(1500)
    assert page.inner_text(BOT) == partial, "the reply kept streaming after Stop"
    assert "Stopped after" in status(page)
    assert page.locator("#round-slider input[type=range]").get_attribute("max") != "1"  # scrubbable afterwards
    screenshot(page, "browser-3-stopped.png")

    set_checkbox(page, "animate", False)
    set_number(page, "max-new-tokens", 16)
    send(page, "hello")
    page.wait_for_function(f'document.querySelectorAll("{BOT}").length === 2')
    done = wait_done(page)
    # The next reply continues the conversation, the stopped reply included: the engine's first tokens of the story.
    story = engine_result(models, "Once upon a time", max_new_tokens=300)
    conversation = [
        {"role": "user", "content": "Once upon a time"},
        {"role": "assistant", "content": models.tokenizer.decode(story.token_ids[:stopped], skip_special_tokens=True)},
        {"role": "user", "content": "hello"},
    ]
    expected = engine_result(models, conversation, max_new_tokens=16)
    # The app keeps serving after a Stop: this reply runs to its end, the 16 tokens asked for, as the engine's does on
    # the same conversation. (Its rounds are not compared: the browser's round trip of the stopped reply may normalise
    # its whitespace, which changes the drafter's context but not the length.)
    assert expected.stop_reason == "max_new_tokens" and int(done[1]) == expected.new_tokens
    assert "stop: max_new_tokens" in status(page)

    set_checkbox(page, "animate", True)
    send(page, "Once upon a time")
    page.wait_for_function("/… round ([2-9]|\\d\\d)/.test(document.querySelector('#status').innerText)")
    page.dispatch_event("#clear", "click")  # mid-animation too (see above)
    page.wait_for_function(f'document.querySelectorAll("{BOT}").length === 0')
    page.wait_for_timeout(1500)
    assert page.locator(BOT).count() == 0 and status(page) == "", "a late update came back after Clear"


def test_a_sweep_runs_live_with_a_progress_bar_draws_its_heatmaps_and_stops(page, models):
    message = "Book a table for two."
    page.fill("#message textarea", message)  # the sweep's prompt: typed in the chat box, not sent
    page.get_by_role("tab", name="Sweep").click()
    for group, value, on in (("sweep-drafts", "4", False), ("sweep-drafts", "2", True), ("sweep-steps", "2", False)):
        box = page.locator(f"#{group}").get_by_label(value, exact=True)
        if box.is_checked() != on:
            box.click()
    set_number(page, "sweep-block", 4)
    set_number(page, "sweep-max-new-tokens", 24)
    page.locator("#sweep-source").get_by_label(CHAT_BOX).check()
    page.evaluate("""() => {
        window.progressSeen = [];
        new MutationObserver(() => {
            const bar = document.querySelector('#sweep-status .progress-text, #sweep-status .progress-level');
            if (bar) window.progressSeen.push(bar.textContent);
        }).observe(document.body, {subtree: true, childList: true, characterData: true});
    }""")
    page.click("#sweep-run")
    page.wait_for_function("document.querySelector('#sweep-status').innerText.includes('✓')")
    assert page.evaluate("window.progressSeen.length") > 0, "no progress bar was shown"
    oracle = bench_measure.sweep(models, [message], "K=1,2 T=1 L=4", max_new_tokens=24)
    xpress = [s for s in oracle.summaries if s.setting.method == XPRESS]
    page.wait_for_selector("#sweep-heatmap-tau .js-plotly-plot .main-svg")
    tau = svg_text(page, "sweep-heatmap-tau")
    assert "L = 4" in tau and "T (denoise steps)" in tau
    for s in xpress:  # τ does not depend on timing: the cells show the oracle's values
        assert f"{s.tau:.2f}" in tau
    assert "L = 4" in svg_text(page, "sweep-heatmap-tokens")
    table = page.inner_text("#sweep-table")
    assert "plain decoding (transformers generate)" in table
    assert all(s.setting.label in table for s in xpress)
    assert page.locator("#block input[type=range]").get_attribute("max") == "8"  # the tiny drafter's trained block
    screenshot(page, "browser-4-sweep.png")

    set_number(page, "sweep-max-new-tokens", 256)
    page.evaluate("window.progressSeen = []")
    page.click("#sweep-run")
    page.wait_for_function("window.progressSeen.length > 0")
    page.click("#sweep-stop")
    page.wait_for_function("document.querySelector('#sweep-status').innerText.includes('Sweep stopped after')")
    assert "L = 4" in svg_text(page, "sweep-heatmap-tau")  # the last sweep's heatmaps stay

    page.locator("#sweep-drafts").get_by_label("1", exact=True).uncheck()
    page.locator("#sweep-drafts").get_by_label("2", exact=True).uncheck()
    page.click("#sweep-run")
    page.wait_for_selector(".toast-body:has-text('Pick at least one value of drafts K')")
    page.locator("#sweep-drafts").get_by_label("1", exact=True).check()
    set_number(page, "sweep-max-new-tokens", 4)
    page.click("#sweep-run")
    page.wait_for_function("document.querySelector('#sweep-status').innerText.includes('settings: 1')")
    page.get_by_role("tab", name="Chat").click()
