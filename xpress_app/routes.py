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
                problem, replay = self.unknown_call(path, body), replayed(body, receive)
        if problem is None:
            return await self.app(scope, replay, send)
        LOG.warning("refused %s %s: %s", method, one_line(path), problem)
        await JSONResponse({"error": problem}, status_code=status)(scope, receive, send)

    def unknown_call(self, path: str, body: bytes) -> str | None:
        """An unknown endpoint name or fn_index in a POST, or None when the call names a real one."""
        try:
            payload = json.loads(body)
        except ValueError:
            return None  # Gradio's own validation answers malformed bodies (422)
        fn_index = payload.get("fn_index") if isinstance(payload, dict) else None
        if isinstance(fn_index, int) and not isinstance(fn_index, bool):
            return None if fn_index in self.blocks.fns else f"no function with fn_index {fn_index}"
        named = NAMED_POST.fullmatch(path)
        if named is None or named["name"] in {fn.api_name for fn in self.blocks.fns.values()}:
            return None  # a name Gradio knows: it decides (private ones it refuses itself)
        public = sorted(f"/{fn.api_name}" for fn in self.blocks.fns.values() if fn.api_visibility == "public")
        return f"no endpoint /{one_line(named['name'])[:80]}; the API has {', '.join(public)}"

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
