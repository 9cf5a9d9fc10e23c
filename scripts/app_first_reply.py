"""A newcomer's first replies in the browser, and the server's memory: ``python -m scripts.app_first_reply [REPLIES]``.

A measurement, not a test: it starts ``python app.py`` as the README's first command does (its default preset, SmolLM2
where installed; default threads), opens the page in chromium the moment the server answers, sends REPLIES chat
messages (default 3) one after another as a person would, and prints, from the start of ``python app.py``: when the
page was up, and per reply when its first words showed and when it ended (the status line's ✓), its tokens, its
engine tokens/s; then the server's resident memory now and at its peak (``VmHWM``). Run it twice: the first run on a
fresh machine also converts SmolLM2's weights and measures the dtype and auto's setting (all cached after).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

from tests.app_browser import BOT, CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, send, status, wait_done
from tests.app_server import OUTPUT, ROOT, free_port, wait_until_serving

MESSAGES = (
    "I need a hotel in San Francisco for three nights.",
    "Something cheap please, near downtown.",
    "Write a short story about a cat who finds a red ball.",
)


def memory_mb(pid: int) -> dict[str, float]:
    """The process's resident memory now (VmRSS) and at its peak (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as lines:
        pairs = [line.partition(":")[::2] for line in lines]
    return {name: int(value.split()[0]) / 1024 for name, value in pairs if name in ("VmRSS", "VmHWM")}


def reply_times(page, start: float, message: str) -> dict:
    """Send ``message``; seconds from ``start`` to the reply's first words and to its end, and what the status says."""
    replies = page.locator(BOT).count()
    send(page, message)
    page.wait_for_function(
        f"""() => {{ const b = document.querySelectorAll("{BOT}");
                    return b.length > {replies} && b[b.length - 1].innerText.trim().length > 0; }}""",
        timeout=TIMEOUT_MS * 3,
    )
    first = time.monotonic() - start
    done = wait_done(page)
    ended = time.monotonic() - start
    engine = status(page).split("·")
    return {
        "message": message,
        "first_words_s": round(first, 2),
        "ended_s": round(ended, 2),
        "tokens": int(done.group(1)) if done else None,
        "status": " ".join(part.strip() for part in engine)[:160],
        "reply": page.locator(BOT).last.inner_text()[:200],
    }


def main(replies: int = len(MESSAGES)) -> None:
    from playwright.sync_api import sync_playwright

    port, threads = free_port(), torch.get_num_threads()
    env = {"GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": str(threads)}  # torch's default, said aloud
    url = f"http://127.0.0.1:{port}/"
    OUTPUT.mkdir(exist_ok=True)
    with open(OUTPUT / "app-first-reply.log", "w") as log:
        start = time.monotonic()
        server = subprocess.Popen(
            [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until_serving(url, server)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(TIMEOUT_MS)
                page.goto(url)
                page.wait_for_selector("#message textarea")
                page_s = time.monotonic() - start
                times = [reply_times(page, start, m) for m in (MESSAGES * replies)[:replies]]
                browser.close()
            result = {"threads": threads, "page_up_s": round(page_s, 2), "replies": times} | memory_mb(server.pid)
            print(json.dumps(result, indent=1, ensure_ascii=False))
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
