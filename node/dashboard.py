"""The dashboard: server-rendered pages on the HTTP port, a job's log streamed live.

Theory of operation
-------------------
Routes (added to the HTTP API's app by ``node.http_api.make_app``, so they share its port and
its auth: an ACL user as Basic, the default user as Bearer; docs/security.md):

* ``GET /`` - the overview (node_dashboard_view.overview): this node, the cluster's nodes and
  flags, queues with lengths, rates and pause state, dead-letter queues with a *Redrive*
  button, timers, running worker jobs with their latest status line, recent runs.
  ``GET /?part=main`` is the same page's ``<main>`` alone: dashboard.js fetches it every 2 s
  and swaps it in, so every byte shown is still rendered (and escaped) here.
* ``GET /jobs/<id>`` - a job's page: the job as this node holds it, its newest run and status
  lines, and its output.
* ``GET /jobs/<id>/log`` - the output as Server-Sent Events (``stream_run``): the run's output
  is polled with ``Run.read_output(offset)`` every ``POLL_S`` and sent as ``output`` events
  whose data is HTML (``node/ansi.py``: SGR colours to spans, everything escaped), the run's
  panel as ``status`` events and the job's as ``job`` events when they change, and ``end``
  once the run ended and its output was sent. Event IDs are ``<run token>:<offset>``, so a browser that reconnects
  (``Last-Event-ID``) resumes where it was. A new run of the same job (a redelivery) is
  announced and followed. At most ``MAX_STREAMS`` streams at once (503 past that); one whose
  client went away is cancelled by Starlette's disconnect watcher.
* ``GET /static/<file>`` - dashboard.css and dashboard.js, from node/dashboard_assets (no CDN:
  the pages work offline).

The redrive button posts to the HTTP API's ``POST /queues/<name>/redrive`` (node/http_api.py),
and the delete buttons send ``DELETE /messages/<id>``; both carry the page's CSRF token
(``X-CSRF-Token``, from the page's ``csrf-token`` meta tag), which the API requires of every
state-changing request a browser sends.

Escaping: templates are Jinja2 with autoescape; the only markup not escaped by Jinja is the
output HTML made by ``node/ansi.py``, which escapes the text itself. HTML responses carry a
Content-Security-Policy that allows scripts from this origin only.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

import jinja2
import trio
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route

from broker.version import VERSION
from node import dashboard_view as view
from node.ansi import AnsiToHtml
from protocol.jobid import is_valid

if TYPE_CHECKING:
    from broker.acl import User
    from node.server import Server

ASSETS: Final = Path(__file__).with_name("dashboard_assets")
POLL_S: Final = 0.25
KEEPALIVE_S: Final = 15.0
MAX_STREAMS: Final = 100
RENDER_THREADS: Final = 2  # pages rendered at once (others wait their turn)
EVENT_CHUNK: Final = 64 * 1024  # output bytes per SSE event
CSP: Final = ("default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
              "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
_LINES: Final = re.compile(r"\r\n|\r|\n")
STATIC: Final = {"dashboard.css": "text/css", "dashboard.js": "text/javascript"}


def job_url(job_id: str) -> str:
    """A job's page: IDs contain / and +, sent percent-encoded."""
    return "/jobs/" + quote(job_id, safe="")


def _duration(ms: int | float | None) -> str:
    """1.2 s, 3 min 4 s, 2 h 5 min, 3 d 4 h."""
    if ms is None:
        return ""
    s = abs(ms) / 1000
    if s < 60:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{m} min {s} s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m} min"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"


def _clock(ms: int) -> str:
    """A Unix ms time as UTC date and time (the same on every node's page)."""
    if not ms:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + " UTC"


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _rate(r: float | None) -> str:
    return "–" if r is None else f"{r:.1f}/s" if r < 100 else f"{r:.0f}/s"


def make_templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ASSETS), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters.update(duration=_duration, clock=_clock, bytes=_bytes, rate=_rate,
                       job_url=job_url)
    env.globals.update(version=VERSION)
    return env


class Dashboard:
    def __init__(self, server: Server, csrf_token: Callable[[], str] = str,
                 user: Callable[[], User | None] = lambda: None) -> None:
        self.server = server
        # The CSRF token and the ACL user of the request being served (node/http_api.py).
        self.csrf_token = csrf_token
        self.user = user
        self.templates = make_templates()
        self.rates = view.RateTracker()
        self.streams = 0  # SSE streams open now
        self.threads = trio.CapacityLimiter(RENDER_THREADS)
        self.assets = {name: (ASSETS / name).read_bytes() for name in STATIC}

    async def _html(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        # The context is plain data read on the event loop (dashboard_view); rendering it,
        # the long part with hundreds of queues, goes to a thread while the node serves on.
        page = self.templates.get_template(template)
        context["csrf_token"] = self.csrf_token()  # for the user who loads the page
        body = await trio.to_thread.run_sync(lambda: page.render(**context),
                                             limiter=self.threads)
        return HTMLResponse(body, status_code=status, headers={
            "Content-Security-Policy": CSP, "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff"})

    # -- pages --------------------------------------------------------------------------------

    def visible(self) -> view.Visible:
        """The queues the request's user may see: those their queue patterns allow (an ACL
        user sees on the dashboard what they could read over RESP)."""
        user = self.user()
        return view.everything if user is None or user.all_queues else user.may_use

    async def overview(self, request: Request) -> Response:
        data = view.overview(self.server, self.rates, self.visible())
        template = "overview_main.html" if request.query_params.get("part") == "main" \
            else "overview.html"
        return await self._html(template, **data)

    def _job_id(self, request: Request) -> bytes | None:
        raw = request.path_params["id"].encode("utf-8", "surrogateescape")
        return raw if is_valid(raw) else None

    async def job(self, request: Request) -> Response:
        job_id = self._job_id(request)
        if job_id is None:
            return await self._html("missing.html", 400, what="This is not a job ID (D-...).")
        data = view.job_page(self.server, job_id, self.visible())
        if data is None:
            return await self._html("missing.html", 404,
                              what="This node holds no such job and has no run of it.")
        return await self._html("job.html", stream=job_url(data["job_id"]) + "/log", **data)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(self.assets[name], media_type=STATIC[name],
                        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})

    # -- the live log -------------------------------------------------------------------------

    async def log(self, request: Request) -> Response:
        job_id = self._job_id(request)
        if job_id is None:
            return Response("not a job ID", status_code=400, media_type="text/plain")
        broker = self.server.broker
        if broker.runs.get(job_id) is None and job_id not in broker.jobs \
                or view.job_page(self.server, job_id, self.visible()) is None:
            return Response("no such job or run", status_code=404, media_type="text/plain")
        if self.streams >= MAX_STREAMS:
            return Response(f"too many log streams open (at most {MAX_STREAMS})",
                            status_code=503, media_type="text/plain",
                            headers={"Retry-After": "5"})
        resume = _parse_event_id(request.headers.get("last-event-id", ""))
        return StreamingResponse(self._counted(self.stream_run(job_id, resume)),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store",
                                          "X-Accel-Buffering": "no"})

    async def _counted(self, events: AsyncIterator[str]) -> AsyncIterator[str]:
        self.streams += 1
        try:
            async for event in events:
                yield event
        finally:
            self.streams -= 1

    async def stream_run(self, job_id: bytes,
                         resume: tuple[bytes, int] | None = None) -> AsyncIterator[str]:
        """The SSE events of ``job_id``'s newest run: see the module docstring."""
        broker = self.server.broker
        token = b""
        offset = 0
        converter = AnsiToHtml()
        shown: tuple[Any, ...] | None = None
        job_shown: tuple[Any, ...] | None = None
        quiet = 0.0
        yield "retry: 2000\n\n"
        while True:
            job = broker.jobs.get(job_id)
            job_state = None if job is None else (job.state, job.nacks, job.deliveries)
            if job_state != job_shown:
                if job_shown is not None:  # the page was rendered with the first one
                    yield _event("job", self._job_panel(job_id), None)
                job_shown = job_state
            run = broker.runs.get(job_id)
            if run is None:
                if job_id not in broker.jobs:
                    yield _event("end", "gone", None)  # (an event with no data is not one)
                    return
                if shown is None:  # queued, not started: say so once, then wait for a run
                    shown = ()
                    yield _event("status", self._panel(None), None)
            else:
                if run.token != token:
                    if token:
                        yield _event("output", _banner(f"new run: attempt {run.attempt} on "
                                                       f"{run.worker}"), None)
                    token, converter, shown = run.token, AnsiToHtml(), None
                    offset = resume[1] if resume and resume[0] == token else 0
                    resume = None
                data, nxt = run.read_output(offset)
                skipped = nxt - len(data) - offset
                if skipped > 0:
                    yield _event("output", _banner(f"{skipped} bytes not kept"), None)
                for i in range(0, len(data), EVENT_CHUNK):
                    piece = data[i:i + EVENT_CHUNK]
                    offset = nxt - len(data) + i + len(piece)
                    html = converter.feed(piece)
                    if html:
                        yield _event("output", html, f"{token.decode()}:{offset}")
                offset = nxt
                ended = run.state != "running"
                state = (run.token, run.state, len(run.status), run.status_dropped,
                         run.exit_code, run.reason, run.output_size)
                if state != shown:
                    shown = state
                    yield _event("status", self._panel(run), None)
                    quiet = 0.0
                if ended and run.read_output(offset)[0] == b"":
                    tail = converter.feed(b"", final=True)
                    if tail:
                        yield _event("output", tail, None)
                    yield _event("end", run.state, None)
                    return
            await trio.sleep(POLL_S)
            quiet += POLL_S
            if quiet >= KEEPALIVE_S:
                quiet = 0.0
                yield ": keep-alive\n\n"  # proxies close connections silent for too long

    def _job_panel(self, job_id: bytes) -> str:
        data = view.job_page(self.server, job_id)
        return self.templates.get_template("job_panel.html").render(
            job=None if data is None else data["job"],
            result=None if data is None else data["result"])

    def _panel(self, run: Any) -> str:
        now = self.server.clock.now_ms()
        return self.templates.get_template("run_panel.html").render(
            run=None if run is None else view.run_detail(run, now))

    def routes(self) -> list[Route]:
        return [
            Route("/", self.overview, methods=["GET"]),
            Route("/jobs/{id:path}/log", self.log, methods=["GET"]),
            Route("/jobs/{id:path}", self.job, methods=["GET"]),
            Route("/static/{name}", self.static, methods=["GET"]),
        ]


def _event(name: str, data: str, event_id: str | None) -> str:
    """One SSE event; every line of ``data`` gets its own ``data:`` field (SSE's rule)."""
    lines = [f"event: {name}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines += [f"data: {line}" for line in _LINES.split(data)]
    return "\n".join(lines) + "\n\n"


def _banner(message: str) -> str:
    """A line of the dashboard's own between output lines, as HTML (``message`` may hold a
    worker's name: escaped)."""
    return f'\n<span class="note">── {html.escape(message)} ──</span>\n'


def _parse_event_id(raw: str) -> tuple[bytes, int] | None:
    token, sep, offset = raw.rpartition(":")
    if not sep or not offset.isdigit() or len(offset) > 18:
        return None
    return token.encode(), int(offset)
