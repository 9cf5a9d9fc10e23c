"""Gradio's raw routes, guarded: a request naming an endpoint, ``fn_index``, event id or session the app does not have
gets a 404 that says so. Gradio 6 answers those with a 500 and a traceback in the log (a KeyError, a
FnIndexInferError, or a 404 raised after its event stream has started), and a public Space is called with anything.

An ASGI middleware, installed through ``launch(app_kwargs=...)``; it reads the queue's bookkeeping the way Gradio's own
routes do, and lets everything it does not recognise through unchanged."""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs

from starlette.responses import JSONResponse

from .log import LOG, one_line

PREFIX = r"(?:.*)/gradio_api"
NAMED_POST = re.compile(PREFIX + r"/(?:run|api|call|call/v2)/(?P<name>[^/]+)/?")
JOIN = re.compile(PREFIX + r"/queue/join/?")
EVENT_GET = re.compile(PREFIX + r"/call/(?:v2/)?(?P<name>[^/]+)/(?P<event>[^/]+)/?")
DATA_GET = re.compile(PREFIX + r"/queue/data/?")
MAX_BODY_BYTES = 16 << 20  # a call's JSON; 2 MB texts are well within it


class RouteGuard:
    """404 for unknown endpoints, fn_index values, event ids and sessions; everything else goes to Gradio."""

    def __init__(self, app, blocks):
        self.app, self.blocks = app, blocks

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope["method"], scope["path"]
        problem, status, replay = None, 404, receive
        if method == "GET":
            problem = self.unknown_stream(path, scope.get("query_string", b"").decode("latin-1"))
        elif method == "POST" and (JOIN.fullmatch(path) or NAMED_POST.fullmatch(path)):
            body = await read_body(receive)
            if body is None:
                problem, status = f"the request body is over {MAX_BODY_BYTES} bytes", 413
            else:
                problem, status = self.unknown_call(path, body) or (None, 200)
                replay = replayed(body, receive)
        if problem is None:
            return await self.app(scope, replay, send)
        LOG.warning("refused %s %s: %s", method, one_line(path), problem)
        await JSONResponse({"error": problem}, status_code=status)(scope, receive, send)

    def unknown_call(self, path: str, body: bytes) -> tuple[str, int] | None:
        """What is wrong with a POST Gradio would answer with a 500 or a traceback (an unknown endpoint or fn_index,
        an empty session, the wrong number of inputs), with its status; None to let Gradio answer."""
        try:
            payload = json.loads(body)
        except ValueError:
            return None  # Gradio's own validation answers malformed bodies (422)
        if not isinstance(payload, dict):
            return None
        session = payload.get("session_hash")
        if session is not None and not (isinstance(session, str) and session):
            return "session_hash must be a non-empty string", 422
        fn_index = payload.get("fn_index")
        if isinstance(fn_index, int) and not isinstance(fn_index, bool):
            fn = self.blocks.fns.get(fn_index)
            if fn is None:
                return f"no function with fn_index {fn_index}", 404
        elif JOIN.fullmatch(path):  # no fn_index, or not a whole number (Gradio's validation says so: 422)
            return ("queue/join needs the fn_index of a function", 422) if fn_index is None else None
        else:  # by name (/call/ bodies have no fn_index: one sent is ignored)
            fn = self.named(NAMED_POST.fullmatch(path))
            if isinstance(fn, str):
                return fn, 404
        return None if fn is None else wrong_inputs(fn, payload.get("data"))

    def named(self, match: re.Match | None):
        """The function an endpoint name calls, None when there is no name, or why there is none (a message)."""
        if match is None:
            return None
        fn = next((fn for fn in self.blocks.fns.values() if fn.api_name == match["name"]), None)
        if fn is not None:
            return fn
        public = sorted(f"/{fn.api_name}" for fn in self.blocks.fns.values() if fn.api_visibility == "public")
        return f"no endpoint /{one_line(match['name'])[:80]}; the API has {', '.join(public)}"

    def unknown_stream(self, path: str, query: str) -> str | None:
        """An event id or session hash the queue does not hold (Gradio would fail after starting the stream)."""
        queue = self.blocks._queue
        event = EVENT_GET.fullmatch(path)
        if event is not None:
            session = self.session_of(event["event"])
            return None if session in queue.pending_messages_per_session else "no such event (unknown or finished)"
        if DATA_GET.fullmatch(path):
            session = (parse_qs(query).get("session_hash") or [""])[0]
            return None if session in queue.pending_messages_per_session else "no such session"
        return None

    def session_of(self, event_id: str) -> str:
        """The session an event id belongs to, found as Gradio's ``/call`` route finds it."""
        queue = self.blocks._queue
        event = queue.event_ids_to_events.get(event_id)
        if event is not None:
            return event.session_hash
        pending = queue.pending_event_ids_session.items()
        return next((session for session, ids in pending if event_id in ids), event_id)


def wrong_inputs(fn, data) -> tuple[str, int] | None:
    """A list of inputs of the wrong length (Gradio fails on it inside the queue, with a traceback): the endpoint's
    advertised inputs, or all of them with the page's hidden state (which the queue fills in)."""
    if not isinstance(data, list):
        return None  # Gradio's validation refuses it (422)
    advertised = [block for block in fn.inputs if not block.skip_api]
    if len(data) in (len(fn.inputs), len(advertised)):
        return None
    return f"{len(advertised)} inputs expected, got {len(data)}", 422


async def read_body(receive) -> bytes | None:
    """The whole request body (what came before a disconnect), or None past ``MAX_BODY_BYTES``."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_BODY_BYTES:
            return None
        if not message.get("more_body", False):
            return b"".join(chunks)


def replayed(body: bytes, receive):
    """A receive channel that hands the app the body already read, then the client's own messages (disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
