"""Driving the app's page in chromium with playwright: shared by the browser test and the screenshot script."""

from __future__ import annotations

import os
import re
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
TIMEOUT_MS = 60_000
# A whole reply's wait: 5-6 s on a quiet 2-core machine, but once over 60 s in CI (two test workers, the server and
# chromium drawing a frame per denoise step on the same 2 cores). A reply that never comes still fails, saying the
# status it stopped at.
REPLY_TIMEOUT_MS = 180_000
BOT = "#chatbot [data-testid='bot']"
DONE = re.compile(r"✓ (\d+) tokens in (\d+) rounds · τ = ([\d.]+)")


def browser_problem() -> str | None:
    """Why no browser test can run here, or None."""
    if not CHROMIUM.exists():
        return f"chromium is not installed at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright)"
    return None


def require_browser() -> None:
    """Skip the calling test when no browser can run here; fail instead under XPRESS_REQUIRE_BROWSER=1 (CI)."""
    import pytest

    problem = browser_problem()
    if problem:
        if os.environ.get("XPRESS_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser test required (XPRESS_REQUIRE_BROWSER=1) but {problem}")
        pytest.skip(problem)


def status(page) -> str:
    return page.inner_text("#status")


def wait_done(page) -> re.Match:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function("document.querySelector('#status').innerText.includes('✓')", timeout=REPLY_TIMEOUT_MS)
    except PlaywrightTimeout:
        bots = page.locator(BOT)
        last = bots.last.inner_text() if bots.count() else "(no reply)"
        raise AssertionError(
            f"no reply ended within {REPLY_TIMEOUT_MS / 1000:.0f} s: status {status(page)!r}, last reply {last!r}"
        ) from None
    return DONE.search(status(page))


def start_fresh(page) -> None:
    """An empty chat, once Clear's own reply is in: waiting only for no replies on the page passes at once on an empty
    chat, and Clear's late reply then emptied the message box a test had just filled (one CI run sent an empty
    message). Clear empties the box, so a marker left there tells when its reply came."""
    page.fill("#message textarea", "(clearing)")
    page.click("#clear")
    page.wait_for_function(
        f'document.querySelectorAll("{BOT}").length === 0 && document.querySelector("#message textarea").value === ""'
    )


def set_checkbox(page, elem_id: str, on: bool) -> None:
    box = page.locator(f"#{elem_id} input[type=checkbox]")
    if box.is_checked() != on:
        box.click()


def set_number(page, elem_id: str, value: int) -> None:
    field = page.locator(f"#{elem_id} input[type=number]")
    field.fill(str(value))
    field.press("Enter")
    page.wait_for_function(f"document.querySelector('#{elem_id} input[type=range]').value === '{value}'")


def send(page, message: str) -> None:
    page.fill("#message textarea", message)
    page.click("#send")


def svg_text(page, elem_id: str) -> str:
    return page.eval_on_selector(
        f"#{elem_id}", "e => Array.from(e.querySelectorAll('svg text')).map(t => t.textContent).join(' | ')"
    )


def open_app(playwright, url: str, width: int = 1400, height: int = 1000):
    """A browser, and a page on the app in a window of ``width`` x ``height`` once its message box is there."""
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    return browser, open_page(browser, url, width, height)


def open_page(browser, url: str, width: int, height: int):
    """A new visitor's page on the app (a session of its own), once its message box is there."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    page.wait_for_selector("#message textarea")
    return page
