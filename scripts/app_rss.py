"""The app server's resident memory over sequential chat requests: ``python -m scripts.app_rss [N] [WARMUP]``.

A measurement, not a test: it serves the embedded models (``python app.py``), sends WARMUP requests (default 20: models
loaded, caches filled) and then N more (default 200) one after another through gradio_client, varied prompts, seeds,
histories and Race, and prints the server's RSS every 20 requests, the least-squares slope of RSS over the N requests
after the warm-up (MB per 100 requests) and the change from the first to the last reading after it.
"""

from __future__ import annotations

import sys

import psutil
from gradio_client import Client

from tests.app_server import serve_app
from tests.test_app_server import request
from xpress_app.config import EMBEDDED_PRESET

PROMPTS = ("I want to book a table for two tonight.", "Tell me a story about a dragon.", "Find me a flight to Chicago.")
EVERY = 20


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (request, MB) points, in MB per request."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def main(n: int = 200, warmup: int = 20) -> None:
    with serve_app({"XPRESS_DEVICE": "cpu"}, "app-rss") as url:
        server = next(p for p in psutil.Process().children() if "app.py" in " ".join(p.cmdline()))
        client = Client(url, verbose=False)
        history: list[dict] = []
        after: list[tuple[int, float]] = []
        for i in range(1, warmup + n + 1):
            prompt = PROMPTS[i % len(PROMPTS)]
            changes = {"preset": EMBEDDED_PRESET, "seed": i, "temperature": 0.7 * (i % 2), "race": i % 5 == 0}
            outputs = client.predict(api_name="/chat", **request(prompt, history=history[-8:], **changes))
            history = outputs[1]
            if i % EVERY == 0 or i == warmup:
                rss = server.memory_info().rss / 2**20
                print(f"after {i:3d} requests: RSS {rss:.1f} MB", flush=True)
                if i >= warmup:
                    after.append((i, rss))
        first, last = after[0][1], after[-1][1]
        print(
            f"after the {warmup}-request warm-up, over {n} requests: slope {100 * slope(after):+.2f} MB per 100 "
            f"requests; RSS {first:.1f} -> {last:.1f} MB ({100 * (last - first) / first:+.1f} %)"
        )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
