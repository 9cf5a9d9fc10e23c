"""The app server's resident memory over sequential chat requests: ``python -m scripts.app_rss [N]``.

A measurement, not a test: it serves the embedded models (``python app.py``), sends N requests (default 100) one after
another through gradio_client, varied prompts, seeds and histories, and prints the server's RSS along the way and its
change after the first ten (the warm-up: models loaded, caches filled).
"""

from __future__ import annotations

import sys

import psutil
from gradio_client import Client

from tests.app_server import serve_app
from tests.test_app_server import request
from xpress_app.config import EMBEDDED_PRESET

PROMPTS = ("I want to book a table for two tonight.", "Tell me a story about a dragon.", "Find me a flight to Chicago.")
CHECKPOINTS = (1, 10, 25, 50, 75, 100)


def main(n: int = 100) -> None:
    with serve_app({"XPRESS_DEVICE": "cpu"}, "app-rss") as url:
        server = next(p for p in psutil.Process().children() if "app.py" in " ".join(p.cmdline()))
        client = Client(url, verbose=False)
        history: list[dict] = []
        rss = {}
        for i in range(1, n + 1):
            prompt = PROMPTS[i % len(PROMPTS)]
            changes = {"preset": EMBEDDED_PRESET, "seed": i, "temperature": 0.7 * (i % 2), "race": i % 5 == 0}
            outputs = client.predict(api_name="/chat", **request(prompt, history=history[-8:], **changes))
            history = outputs[1]
            if i in CHECKPOINTS or i == n:
                rss[i] = server.memory_info().rss / 2**20
                print(f"after {i:3d} requests: RSS {rss[i]:.0f} MB", flush=True)
        base = rss.get(10, rss[min(rss)])
        print(f"RSS change from request 10 to {n}: {100 * (rss[n] - base) / base:+.1f} %")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
