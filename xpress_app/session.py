"""A browser session's Stop/Clear requests, shared by its tabs' handlers, and the tickets that carry them to a reply
decoding in another process (a ZeroGPU worker)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

CLEAR_WAIT_S = 5.0  # Clear waits this long at most for a running reply to notice it
_TICKETS: list[Path] = []  # the folder of this server's stop tickets, made on first use


@dataclass(frozen=True)
class StopTicket:
    """A session's stop request as a file: it crosses into a process forked before the request was made (ZeroGPU
    forks a worker once and may reuse it), where a flag in this process's memory would never arrive. A reply polls it
    between rounds (one ``stat``)."""

    path: str

    def requested(self) -> bool:
        return os.path.exists(self.path)

    def request(self) -> None:
        Path(self.path).touch()

    def clear(self) -> None:
        Path(self.path).unlink(missing_ok=True)


def new_ticket() -> StopTicket:
    if not _TICKETS:
        _TICKETS.append(Path(tempfile.mkdtemp(prefix="xpress-stops-")))
        atexit.register(shutil.rmtree, _TICKETS[0], ignore_errors=True)
    return StopTicket(str(_TICKETS[0] / uuid.uuid4().hex))


class Controls:
    """A browser session's Stop/Clear requests, read by its running reply between rounds.

    Gradio's own cancellation would kill the generator while its next update may still be on the way, so a stop could
    land before the last frames; a reply that ends itself sends its final view after everything else.
    """

    def __init__(self):
        self.stop = False
        self.running = 0  # replies of this session being decoded
        self._ticket: StopTicket | None = None  # made on first use: the page's initial value is copied per session

    @property
    def ticket(self) -> StopTicket:
        """The session's stop request, as a GPU function receives it."""
        if self._ticket is None:
            self._ticket = new_ticket()
            if self.stop:
                self._ticket.request()
        return self._ticket

    def arm(self) -> None:
        """A new run starts: forget an earlier stop."""
        self.stop = False
        self.ticket.clear()

    def request_stop(self) -> None:
        self.stop = True
        self.ticket.request()

    def release(self) -> None:
        """The session ended (Gradio deletes its state): its stop file goes now, not when the server exits (a session
        that pressed Stop would otherwise leave one in the temporary folder)."""
        if self._ticket is not None:
            self._ticket.clear()

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
