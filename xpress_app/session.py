"""A browser session's Stop/Clear requests, shared by its tabs' handlers."""

from __future__ import annotations

import time

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
