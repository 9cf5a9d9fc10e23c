"""The README's screenshot: what a visitor sees first, at 1440x900 in chromium, after sending the first example.

    python -m scripts.app_screenshot [--target DIR --drafter DIR] [--message TEXT] [--threads N]
        [--out assets/app_screenshot.png]

Without --target the app starts on its default preset (SmolLM2 where its wheel is installed, else the embedded
models); with it, on a custom preset. ``--message`` types a message instead of clicking the example. It also prints
what a newcomer waits: from the page's load to the first reply's end, and the server's resident memory then. The
browser test saves the same view (on the tiny random models) as test-output/browser-first-screen-1440x900.png.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import psutil

from tests.app_browser import browser_problem, open_app, send, wait_done
from tests.app_server import ROOT, serve_app
from xpress_app.texts import EXAMPLES

FIRST_SCREEN = (1440, 900)  # a laptop browser window, in CSS pixels
MAX_BYTES = 500_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--drafter")
    parser.add_argument("--message", help="type this message instead of clicking the first example")
    parser.add_argument(
        "--threads", default="1", help="the server's torch threads (OMP_NUM_THREADS; the app's default: 2)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "app_screenshot.png")
    args = parser.parse_args()
    problem = browser_problem()
    if problem:
        raise SystemExit(problem)
    from PIL import Image
    from playwright.sync_api import sync_playwright

    env = {name: value for name, value in (("XPRESS_TARGET", args.target), ("XPRESS_DRAFTER", args.drafter)) if value}
    with serve_app(env | {"OMP_NUM_THREADS": args.threads}, "app-screenshot") as url, sync_playwright() as playwright:
        browser, page = open_app(playwright, url, *FIRST_SCREEN)
        loaded = time.perf_counter()
        if args.message:
            send(page, args.message)
        else:
            page.get_by_role("button", name=next(iter(EXAMPLES))).click()
        wait_done(page)
        waited, rss = time.perf_counter() - loaded, server_rss_mb(url)
        page.wait_for_timeout(1000)  # the last Plotly redraws
        png = page.screenshot()  # the first screen only, as a visitor sees it
        verdict = page.inner_text("#verdict")
        browser.close()
    image = Image.open(io.BytesIO(png))
    while len(png) > MAX_BYTES:  # keep the repository light: shrink until it fits
        image = image.resize((image.width * 4 // 5, image.height * 4 // 5), Image.LANCZOS)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", optimize=True)
        png = buffer.getvalue()
    args.out.write_bytes(png)
    print(f"{args.out} ({image.width}x{image.height}, {len(png) // 1000} kB)\nverdict: {verdict}")
    print(f"first reply done {waited:.1f} s after the page loaded; server RSS then {rss:.0f} MB")


def server_rss_mb(url: str) -> float:
    """Resident memory of the app process serving ``url`` (``python app.py ... --port N``)."""
    port = url.rstrip("/").rsplit(":", 1)[1]
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "app.py" in cmdline and port in cmdline:
            return process.memory_info().rss / 2**20
    raise SystemExit(f"no app process serves {url}")


if __name__ == "__main__":
    main()
