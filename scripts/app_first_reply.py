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
import sys
import time

import psutil
import torch

from tests.app_browser import BOT, CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, send, status, wait_done
from tests.app_server import serve_app

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
    return {
        "message": message,
        "first_words_s": round(first, 2),
        "ended_s": round(ended, 2),
        "tokens": int(done.group(1)) if done else None,
        "status": " ".join(status(page).replace("·", " ").split())[:160],
        "reply": page.locator(BOT).last.inner_text()[:200],
    }


def main(replies: int = len(MESSAGES)) -> None:
    from playwright.sync_api import sync_playwright

    threads = torch.get_num_threads()
    start = time.monotonic()  # ``serve_app`` starts ``python app.py`` right away
    # torch's default thread count, said aloud (``serve_app`` would run the server at one)
    with serve_app({"OMP_NUM_THREADS": str(threads)}, "app-first-reply") as url, sync_playwright() as p:
        server = next(c for c in psutil.Process().children() if "app.py" in " ".join(c.cmdline()))
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


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
