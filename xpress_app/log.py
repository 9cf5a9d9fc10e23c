"""The server's log: a refused request is one line (which route, and why); only real failures get a traceback
(Gradio prints those). A public Space is called with anything, so refusals are common and must not drown a failure."""

from __future__ import annotations

import logging

import gradio as gr

from xpress_core.errors import XpressError

LOG = logging.getLogger("xpress_app")
MAX_LINE_CHARS = 500  # a refusal quotes what was sent (cut short already); the line stays readable whatever it was


def one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 1] + "…"


def refusal(route: str, error: XpressError) -> gr.Error:
    """What the client reads (the error's message), logged as one line; Gradio is told not to print a traceback."""
    LOG.warning("refused %s: %s", route, one_line(str(error)))
    return gr.Error(str(error), print_exception=False)


def log_to_stderr() -> None:
    """The app's lines on stderr beside Gradio's own output (``python app.py``; tests read it from the log file)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s xpress %(levelname)s %(message)s"))
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    LOG.propagate = False
