"""A browser session's Stop/Clear requests, shared by its tabs' handlers."""

from __future__ import annotations

import time

import gradio as gr

CLEAR_WAIT_S = 5.0  # Clear waits this long at most for a running reply to notice it


class Controls:
    """A browser session's Stop/Clear requests, read by its running reply between rounds.

    Gradio's own cancellation would kill the generator while its next update may still be on the way, so a stop could
    land before the last frames; a reply that ends itself sends its final view after everything else.
    """

    def __init__(self):
        self.stop = False
        self.running = 0  # replies of this session being decoded

    def arm(self) -> None:
        """A new run starts: forget an earlier stop."""
        self.stop = False

    def request_stop(self) -> None:
        self.stop = True

    def wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.running and time.monotonic() < deadline:
            time.sleep(0.02)


def never() -> bool:
    """The stop request of a caller that never stops (the CLI, tests, the API without a session)."""
    return False


def forget_replaced_blocks(demo: gr.Blocks, request: gr.Request | None) -> None:
    """Drop the copies of components Gradio keeps per session under ids the page does not have.

    Gradio 6 replaces a component in the session's state whenever an update leaves it out or changes a property, and
    when that component is next an input, registers the replacement again under the replacement's own new id: a
    session kept one more copy of the message box, the history and the panels with every reply (about 4 objects
    and their configs a reply). The page renders nothing dynamically, so every block id outside the app's own is such
    a copy; nothing reads it again. Called at the start of each reply and sweep."""
    session = getattr(request, "session_hash", None)
    state = demo.state_holder.session_data.get(session) if session else None
    if state is None:
        return
    blocks = state.blocks_config.blocks
    for key in [key for key in blocks if key not in demo.blocks]:
        blocks.pop(key, None)
        state.config_values.pop(key, None)
