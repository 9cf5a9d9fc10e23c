"""The README's result plots: each Plotly HTML figure of a bench run rendered to PNG in chromium.

    python -m scripts.bench_pngs RUN.json [--out assets/results]
    python -m scripts.bench_pngs runs/learning_curve.html --out assets/results   # any Plotly HTML figure

The bench writes interactive HTML (plotly.js beside it, offline); a README on the Hub or GitHub shows only images,
and plotly's static export needs kaleido, which is not a dependency: the test browser draws them instead.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tests.app_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, browser_problem

VIEWPORT = {"width": 1100, "height": 560}


def figure_files(run_json: Path) -> dict[str, Path]:
    """Figure name -> HTML file, from the ``files`` map the bench writes into its JSON (an HTML file: itself)."""
    if run_json.suffix == ".html":
        return {run_json.stem: run_json}
    files = json.loads(run_json.read_text())["files"]
    return {name: Path(path) for name, path in files.items() if path.endswith(".html")}


def render_pngs(runs: list[Path], out: Path) -> list[Path]:
    """Screenshot every HTML figure of the runs into ``out/NAME.png``; returns the PNG paths."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(TIMEOUT_MS)
        for name, html in {k: v for run in runs for k, v in figure_files(run).items()}.items():
            page.goto(html.resolve().as_uri())
            page.wait_for_selector(".plotly .main-svg")
            page.wait_for_timeout(300)  # the first layout pass settles after the SVG appears
            written.append(out / f"{name}.png")
            page.locator(".plotly-graph-div").first.screenshot(path=str(written[-1]))
        browser.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "runs", type=Path, nargs="+", help="the JSON written by `python -m xpress_core bench --json`, or HTML figures"
    )
    parser.add_argument("--out", type=Path, default=Path("assets") / "results")
    args = parser.parse_args()
    problem = browser_problem()
    if problem:
        raise SystemExit(problem)
    for path in render_pngs(args.runs, args.out):
        print(path)


if __name__ == "__main__":
    main()
