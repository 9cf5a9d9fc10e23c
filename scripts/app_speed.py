"""Tokens/s of one request through the app and through the CLI, on the same models and settings.

    python -m scripts.app_speed [--target DIR --drafter DIR] [--repeats 5] [--max-new-tokens 256]

The app runs as ``python app.py`` and is driven by gradio_client; its status line gives the engine's tokens/s (UI work
excluded by the engine's clock) and the wall clock of the request on the server (which includes building and sending
the UI updates). The CLI is ``python -m xpress_core generate --json``. Runs alternate between the two; medians are
printed. Without --target the tiny random test models are built in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gradio_client import Client

from tests.app_server import ROOT, serve_app
from xpress_app.config import CUSTOM_PRESET
from xpress_app.settings import DEFAULTS

PROMPT = "I want to book a table for two at an Italian restaurant tonight."
ENGINE = re.compile(r"· ([\d.]+) tokens/s\*\*")
WALL = re.compile(r"Wall clock with the UI: ([\d.]+) tokens/s")


def cli_tokens_per_s(target: str, drafter: str, settings: dict) -> float:
    command = [
        sys.executable,
        "-m",
        "xpress_core",
        "generate",
        "--prompt",
        PROMPT,
        "--chat",
        "--target",
        target,
        "--drafter",
        drafter,
        "--device",
        "cpu",
        "--json",
        "-K",
        str(settings["drafts"]),
        "-T",
        str(settings["steps"]),
        "-L",
        str(settings["block"]),
        "--max-new-tokens",
        str(settings["max_new_tokens"]),
    ]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["tokens_per_s"]


def app_tokens_per_s(client: Client, settings: dict) -> tuple[float, float]:
    outputs = client.predict(
        api_name="/chat",
        message=PROMPT,
        history=[],
        preset=CUSTOM_PRESET,
        temperature=0.0,
        top_p=1.0,
        seed=0,
        refine="parallel",
        verify="tree",
        race=False,
        animate=False,
        **settings,
    )
    status = outputs[2]
    return float(ENGINE.search(status)[1]), float(WALL.search(status)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--drafter")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("-K", type=int, default=DEFAULTS.drafts)
    parser.add_argument("-T", type=int, default=DEFAULTS.steps)
    parser.add_argument("-L", type=int, default=DEFAULTS.block)
    args = parser.parse_args()
    if args.target is None:
        from tests.tiny import build_tiny_zoo

        zoo = build_tiny_zoo(Path(tempfile.mkdtemp(prefix="xpress-speed-")))
        args.target, args.drafter = str(zoo["llama"]), str(zoo["drafter_llama"])
    settings = {"drafts": args.K, "steps": args.T, "block": args.L, "max_new_tokens": args.max_new_tokens}
    env = {"XPRESS_TARGET": args.target, "XPRESS_DRAFTER": args.drafter, "XPRESS_DEVICE": "cpu"}
    cli, engine, wall = [], [], []
    with serve_app(env, "app-speed") as url:
        client = Client(url, verbose=False)
        app_tokens_per_s(client, settings)  # warm-up: loads the models
        for _ in range(args.repeats):
            cli.append(cli_tokens_per_s(args.target, args.drafter, settings))
            shown, clock = app_tokens_per_s(client, settings)
            engine.append(shown)
            wall.append(clock)
    median = statistics.median
    print(f"settings {settings}, {args.repeats} runs each")
    print(f"CLI (engine time):            {median(cli):8.1f} tokens/s  runs {cli}")
    print(f"app, shown (engine time):     {median(engine):8.1f} tokens/s  runs {engine}")
    print(f"app, server wall clock:       {median(wall):8.1f} tokens/s  runs {wall}")
    print(f"app shown / CLI = {median(engine) / median(cli):.3f}; app wall / CLI = {median(wall) / median(cli):.3f}")


if __name__ == "__main__":
    main()
