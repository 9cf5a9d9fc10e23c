"""The panels' geometry in a real browser (chromium via playwright, ``python app.py`` on the tiny models): after two
chat turns with the app's defaults (Auto on) and Race on, at a laptop's two sizes and in a phone's column, every text
box of the accepted-length and latency panels (titles, legend, axis titles, labels) lies inside its panel and clear
of every other, the titles, legend and axis titles clear of the plots, and the plots take most of the panel's height.
Measured from the drawn SVG, not by eye; screenshots go to test-output/.

Skips when chromium or playwright is missing, unless XPRESS_REQUIRE_BROWSER=1 (CI), where that is a failure.
"""

from __future__ import annotations

import re

import pytest

from tests.app_browser import BOT, open_app, open_page, require_browser, send, set_number, svg_text, wait_done
from tests.app_server import OUTPUT, serve_app, zoo_env
from xpress_app.sweep import CHAT_BOX
from xpress_app.texts import EXAMPLES
from xpress_core.plots import MAX_ROWS

pytestmark = pytest.mark.browser

STACKED = ("plot-accept", "plot-latency")
FIRST_SCREEN = ("chatbot", "verdict", "plot-evolution", "round-slider", "step-slider")
PLOT_SHARE = 0.6  # the plots' part of a panel's height, at least (issue 39)
# Every box is [x, y, width, height] in CSS pixels. Plotly draws a subplot's area as its drag rectangle; the text
# boxes are the figure's title, legend, axis titles and annotations (the lower plot's title, the lines' labels).
PANEL_BOXES = """(id) => {
    const box = e => { const b = e.getBoundingClientRect(); return [b.x, b.y, b.width, b.height]; };
    const root = document.querySelector('#' + id);
    const texts = [...root.querySelectorAll('.g-gtitle, .legend, .g-xtitle, .g-ytitle, .g-x2title, .g-y2title')]
        .map(e => ({kind: e.getAttribute('class'), text: e.textContent, box: box(e)}));
    const notes = [...root.querySelectorAll('.annotation')]
        .map(e => ({kind: 'annotation', text: e.textContent, box: box(e)}));
    return {panel: box(root), plots: [...root.querySelectorAll('.nsewdrag')].map(box),
            texts: texts.concat(notes).filter(t => t.box[2] > 0 && t.box[3] > 0)};
}"""


def overlap(a, b) -> float:
    """The area two boxes share (0 when they only touch)."""
    width = min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0])
    height = min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1])
    return max(0.0, width) * max(0.0, height)


def inside(inner, outer, slack: float = 1.0) -> bool:
    return (
        inner[0] >= outer[0] - slack
        and inner[1] >= outer[1] - slack
        and inner[0] + inner[2] <= outer[0] + outer[2] + slack
        and inner[1] + inner[3] <= outer[1] + outer[3] + slack
    )


def on_a_line(text: dict) -> bool:
    """The latency panel's τ and break-even labels sit on their lines, inside the plot, by design."""
    return text["kind"] == "annotation" and text["text"].startswith(("τ ", "break-even "))


def panel_problems(geometry: dict, plot_share: float = PLOT_SHARE) -> list[str]:
    """What makes a panel hard to read: text outside it, text over text, titles or legend over a plot, small plots."""
    panel, plots, texts = geometry["panel"], geometry["plots"], geometry["texts"]
    kinds = {t["kind"] for t in texts}
    problems = [f"no {kind} drawn" for kind in ("g-gtitle", "g-xtitle", "g-ytitle") if kind not in kinds]
    problems += [f"{t['kind']} {t['text']!r} leaves the panel" for t in texts if not inside(t["box"], panel)]
    problems += [
        f"{a['kind']} {a['text']!r} overlaps {b['kind']} {b['text']!r}"
        for i, a in enumerate(texts)
        for b in texts[i + 1 :]
        if overlap(a["box"], b["box"]) > 1
    ]
    problems += [
        f"{t['kind']} {t['text']!r} covers a plot"
        for t in texts
        if not on_a_line(t) and any(overlap(t["box"], plot) > 1 for plot in plots)
    ]
    problems += [
        f"a line's label {t['text']!r} is outside its plot"
        for t in texts
        if on_a_line(t) and not any(inside(t["box"], plot) for plot in plots)
    ]
    share = sum(plot[3] for plot in plots) / panel[3]
    if share < plot_share:
        problems.append(f"the plots take {share:.0%} of the panel's height")
    return problems


@pytest.fixture(scope="module")
def app_url(zoo):
    require_browser()
    from playwright.sync_api import sync_playwright

    with serve_app(zoo_env(zoo), "app-browser-panels") as url, sync_playwright() as playwright:
        browser, _ = open_app(playwright, url)
        yield browser, url
        browser.close()


@pytest.mark.parametrize("width,height", [(1440, 900), (1280, 720), (390, 844)])
def test_the_accepted_length_and_latency_panels_read_at_a_glance(app_url, width, height):
    browser, url = app_url
    page = open_page(browser, url, width, height)  # a new visitor: the app's defaults, Auto on
    page.locator("#race input[type=checkbox]").dispatch_event("click")  # the sidebar may lie over it
    if width < 500:  # on a phone the settings sidebar covers the page until closed
        page.get_by_role("button", name="Toggle Sidebar").click()
    page.get_by_role("button", name=next(iter(EXAMPLES))).click()
    wait_done(page)
    send(page, "And one more thing, please.")
    page.wait_for_function(f'document.querySelectorAll("{BOT}").length === 2')
    wait_done(page)
    page.wait_for_function("document.querySelector('#plot-latency').textContent.includes('plain ')")
    page.wait_for_timeout(1000)  # the last Plotly redraws
    for elem_id in STACKED:
        page.locator(f"#{elem_id}").scroll_into_view_if_needed()
        page.locator(f"#{elem_id}").screenshot(path=str(OUTPUT / f"browser-{elem_id}-{width}x{height}.png"))
        geometry = page.evaluate(PANEL_BOXES, elem_id)
        assert len(geometry["plots"]) == 2, f"#{elem_id}: {geometry}"
        assert not panel_problems(geometry), f"#{elem_id} at {width}x{height}: {panel_problems(geometry)}"
    page.close()


@pytest.mark.parametrize("width,height", [(1440, 900), (1280, 720)])
def test_a_tree_of_many_paths_keeps_the_draft_panel_and_its_sliders_on_the_first_screen(app_url, width, height):
    """K=4 · T=3 pinned: a draft tree of up to 16 root-to-leaf paths, the case Auto picked in issue 39. The panel
    keeps at most MAX_ROWS rows, the chosen path among them, and the sliders under it stay on the first screen."""
    browser, url = app_url
    page = open_page(browser, url, width, height)
    page.locator("#auto input[type=checkbox]").dispatch_event("click")  # Auto off: the sidebar may lie over it
    set_number(page, "drafts", 4)
    set_number(page, "steps", 3)
    send(page, "I want to book a table for two")
    wait_done(page)
    page.wait_for_timeout(1000)  # the last Plotly redraws
    page.evaluate("window.scrollTo(0, 0)")
    for elem_id in FIRST_SCREEN:
        box = page.locator(f"#{elem_id}").bounding_box()
        assert box["y"] >= 0 and box["y"] + box["height"] <= height, f"#{elem_id} at {box} is below {width}x{height}"
    evolution = svg_text(page, "plot-evolution")
    rows = page.eval_on_selector_all("#plot-evolution .yaxislayer-above .ytick", "ticks => ticks.length")
    assert 1 <= rows <= MAX_ROWS and "★ draft" in evolution
    page.screenshot(path=str(OUTPUT / f"browser-tree-first-screen-{width}x{height}.png"))
    page.close()


@pytest.mark.parametrize("width,height", [(1440, 900), (1280, 720)])
def test_the_sweep_tab_reads_at_a_glance(app_url, width, height):
    """A small sweep on the chat box text: its heatmaps' text clear of each other and of the cells' area, the heatmap
    the larger part of its panel, the table within the page's width, each speedup with its spread."""
    browser, url = app_url
    page = open_page(browser, url, width, height)
    page.fill("#message textarea", "Book a table for two.")
    page.get_by_role("tab", name="Sweep").click()
    for value, on in (("4", False), ("2", True)):
        box = page.locator("#sweep-drafts").get_by_label(value, exact=True)
        if box.is_checked() != on:
            box.click()
    page.locator("#sweep-steps").get_by_label("2", exact=True).uncheck()
    set_number(page, "sweep-block", 4)
    set_number(page, "sweep-max-new-tokens", 8)
    page.locator("#sweep-source").get_by_label(CHAT_BOX).check()
    page.click("#sweep-run")
    page.wait_for_function("document.querySelector('#sweep-status').innerText.includes('✓')")
    page.wait_for_selector("#sweep-heatmap-tau .js-plotly-plot .main-svg")
    page.wait_for_timeout(1000)  # the last Plotly redraws
    assert re.search(r"×[\d.]+ over plain decoding \(half the runs ×[\d.]+–[\d.]+\)", page.inner_text("#sweep-status"))
    assert re.search(r"Measured on a (quiet|busy) machine \(load average", page.inner_text("#sweep-status"))
    for elem_id in ("sweep-heatmap-tokens", "sweep-heatmap-tau"):
        geometry = page.evaluate(PANEL_BOXES, elem_id)
        assert len(geometry["plots"]) == 1, f"#{elem_id}: {geometry}"
        assert not panel_problems(geometry, 0.5), f"#{elem_id} at {width}x{height}: {panel_problems(geometry, 0.5)}"
    table = page.locator("#sweep-table table").bounding_box()
    assert table["x"] >= 0 and table["x"] + table["width"] <= width, f"the table at {table} is wider than {width}"
    rows = page.locator("#sweep-table tbody tr").all_inner_texts()
    assert len(rows) == 3 and all(re.search(r"×[\d.]+ \([\d.]+–[\d.]+\)", row) for row in rows[1:])
    page.screenshot(path=str(OUTPUT / f"browser-sweep-{width}x{height}.png"), full_page=True)
    page.close()
