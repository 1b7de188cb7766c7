"""The HTTP API: mqs's and MQ's routes, as Starlette routes (``make_app``) and as ``Api``
methods that node/http_front.py calls directly for the message routes. docs/http.md is the
user's reference; ``OPENAPI`` (node/http_openapi.py) is the document served at
``/openapi.json``.

Theory of operation
-------------------
No HTTP is parsed here: node/http_front.py and hypercorn speak HTTP/1.1, Starlette routes.
Every route turns into commands run through the node's command path
(``node.conn_core.CommandPath``, the one RESP connections use: counted in commandstats, shown
to MONITOR as ``http:<address>:<port>``) by ``Bridge.call``, which then does what a
connection does after a command: the broker's effects go through ``Server.route``, the reply
waits until its log records are durable (a failed write answers 503 with Retry-After, as MQ
does), blocked GETJOBs (long polling) are answered through ``Server.dispatch_now`` like any blocked
client, whose handle here is a ``_Handle`` that decodes the RESP reply instead of writing it
to a socket, and a CLIENT PAUSE holds the request. So HTTP and RESP clients see one broker:
jobs added over HTTP are consumed over RESP and the other way round.

A queue exists for ``/queues`` (mqs) and ``/mq`` (MQ) when it has a policy
(broker/policies.py): PUT creates one, DELETE deletes it and the jobs of the queue this node
holds. Job IDs contain ``/`` and ``+``: in a path, ``/`` must be sent as ``%2F`` (``+`` may
stay). Every error is JSON ``{"error": text}`` with a 4xx status; nothing here answers 500 for
bad input, and a body is read with a deadline (408) and a 1 MiB limit (413).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

import trio
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive

from broker.clients import BLOCKED, Client
from broker.intents import Intent
from broker.job import JobState
from broker.policy_table import is_header_value
from node.bodies import BodyError, body_of
from node.conn_core import undone
from node.http_auth import REQUEST_USER, Auth, CsrfTokens
from node.http_openapi import MAX_COUNT, MAX_PRIORITY, MAX_WAIT_S, OPENAPI, QUEUE_FIELDS
from protocol.jobid import is_valid
from protocol.resp import NEED_DATA, Error, ReplyReader

if TYPE_CHECKING:
    from node.server import Server

log = logging.getLogger("trisque.http")

MAX_BODY: Final = 1024 * 1024  # mqs's message limit
DRAIN_LIMIT: Final = 8 * MAX_BODY  # an oversized body read and dropped before the 413
BODY_TIMEOUT_S: Final = 10.0  # a client that does not send its body in this time gets 408
RETRY_AFTER_S: Final = "1"
ADDJOB_TIMEOUT_MS: Final = 5000  # ADDJOB's ms-timeout (synchronous replication on a cluster)
OCTET: Final = "application/octet-stream"
REDRIVE_SLICE: Final = 1000  # dead letters moved per loop turn


class HttpError(Exception):
    def __init__(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(text)
        self.status, self.text, self.headers = status, text, headers or {}


class NotDurable(HttpError):
    def __init__(self, text: str) -> None:
        super().__init__(503, f"not stored durably: {text}", {"Retry-After": RETRY_AFTER_S})


def _error(status: int, text: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": text}, status_code=status, headers=headers)


class Answer:
    """A route's reply before it is a Starlette ``Response`` (``response``) or the bytes the
    HTTP front writes itself (node/http_front.py): the same status, headers and body."""

    __slots__ = ("status", "body", "media_type", "headers")

    def __init__(self, status: int, body: bytes = b"", media_type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.media_type = status, body, media_type
        self.headers = headers

    def response(self) -> Response:
        return Response(self.body, self.status, self.headers, self.media_type)


def json_answer(content: Any, status: int = 200, headers: dict[str, str] | None = None,
                ) -> Answer:
    """As Starlette's JSONResponse renders ``content``."""
    body = json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")
    return Answer(status, body, "application/json", headers)


def error_answer(exc: HttpError) -> Answer:
    return json_answer({"error": exc.text}, exc.status, exc.headers)


# =============================================================================================
# The bridge to the broker


class _Handle:
    """A blocked HTTP client's stand-in for a connection (``Server.dispatch_now`` writes to
    it)."""

    class _NoInput:
        buffered = 0

    parser = _NoInput()

    def __init__(self) -> None:
        self.closing = False
        # Made when the command blocks (most never do).
        self.reader: ReplyReader | None = None
        self.value: Any = NEED_DATA
        self.done = _NOT_BLOCKED

    def send_nowait(self, data: bytes) -> None:
        if self.reader is None:
            self.reader = ReplyReader()
        self.reader.feed(data)
        value = self.reader.next()
        if value is not NEED_DATA and self.value is NEED_DATA:
            self.value = value
            self.done.set()

    def blocked_on(self) -> trio.Event:
        """The event set when the blocked command's reply comes."""
        self.done = trio.Event()
        return self.done


_NOT_BLOCKED: Final = trio.Event()  # never waited on (``_Handle.blocked_on`` replaces it)


class Bridge:
    def __init__(self, server: Server) -> None:
        self.server = server

    def _client(self, peer: str) -> Client:
        server = self.server
        server.next_client_id += 1
        user = REQUEST_USER.get()
        client = Client(server.next_client_id, peer, server.clock.now_ms(), _Handle(),
                        user if user is not None else server.broker.acl.default)
        client.authenticated = True  # the HTTP layer checked the password (request_user)
        return client

    async def call(self, *args: str | bytes, peer: str, after: Callable[[Any], None] | None = None,
                   wait_s: float = 0) -> Any:
        """Run one command for the client at ``peer`` (``http:<address>:<port>``, as MONITOR
        shows it) through the node's command path (as a
        RESP connection runs it); its reply once its log records are durable. ``after(reply)``
        runs right after the command, before anything else can (same loop turn)."""
        server = self.server
        broker = server.broker
        counters = server.counters
        while True:
            if counters.stopping:
                raise HttpError(503, "the node is shutting down", {"Retry-After": RETRY_AFTER_S})
            now = server.clock.now_ms()
            if now >= counters.paused_until:
                break
            # CLIENT PAUSE: a request waits, as a RESP client's commands do.
            await trio.sleep((counters.paused_until - now) / 1000)
        client = self._client(peer)
        argv = [a if isinstance(a, bytes) else a.encode() for a in args]
        reply = server.command_path.run(client, argv, now)
        if isinstance(reply, Intent):  # no route sends a command the runtime must finish
            raise HttpError(400, "command not available over HTTP")
        if after is not None:
            after(reply)
        others: list[Any] = []
        ticket = 0
        if broker.outbox:
            try:
                ticket = server.route(broker.take_effects(), others)
            except OSError as exc:  # a body the log holds could not be read back: undone
                reply = undone(reply, exc)
        # REPLJOB, SETACK, QPOLICY ...: after the broker's effects, as a connection does.
        server.bus.flush()
        if others:
            server.dispatch(others, ticket)  # replies to other clients, once durable
        if reply is BLOCKED:
            handle: _Handle = client.handle
            done = handle.blocked_on()
            try:
                with trio.move_on_after(wait_s + 5):  # the broker's own timeout comes first
                    await done.wait()
            finally:
                if not done.is_set():
                    handle.closing = True
                    broker.client_gone(client)
            reply = handle.value if done.is_set() else None
        if ticket:
            failures = await server.wait_durable({ticket})
            if failures:
                raise NotDurable(next(iter(failures.values())))
        return reply

    def policy(self, name: bytes) -> Any:
        return self.server.broker.policies.get(name)


# =============================================================================================
# JSON shapes


def _policy_json(reply: list[Any]) -> dict[str, Any]:
    f = dict(zip(reply[::2], reply[1::2], strict=True))
    redrive = None
    if f[b"dead-letter-queue"] is not None:
        redrive = {"max_receives": f[b"redrive-max-receives"],
                   "dead_letter_queue": f[b"dead-letter-queue"].decode("utf-8", "replace")}
    return {
        "name": f[b"name"].decode("utf-8", "replace"),
        "redrive_policy": redrive,
        "retention_timeout": f[b"retention-timeout"],
        "visibility_timeout": f[b"visibility-timeout"],
        "message_delay": f[b"message-delay"],
        "message_deduplication": bool(f[b"message-deduplication"]),
    }


def _is_int(v: Any) -> bool:
    return type(v) is int


def _queue_options(body: Any) -> list[str]:
    """QPOLICY options from a queue's JSON body; HttpError 400 for anything mqs would refuse
    to parse (types, unknown fields); ranges are checked by the command's parser."""
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    unknown = set(body) - set(QUEUE_FIELDS)
    if unknown:
        raise HttpError(400, f"unknown fields: {', '.join(sorted(unknown))}")
    opts: list[str] = []
    if "redrive_policy" in body:
        rp = body["redrive_policy"]
        if rp is None:
            opts.append("NOREDRIVE")
        else:
            if not isinstance(rp, dict) or set(rp) != {"max_receives", "dead_letter_queue"}:
                raise HttpError(400, "redrive_policy must be null or an object with "
                                     "max_receives and dead_letter_queue")
            if not _is_int(rp["max_receives"]) or not isinstance(rp["dead_letter_queue"], str) \
                    or not rp["dead_letter_queue"]:
                raise HttpError(400, "redrive_policy: max_receives must be an integer and "
                                     "dead_letter_queue a non-empty string")
            opts += ["REDRIVE", str(rp["max_receives"]), rp["dead_letter_queue"]]
    for field, opt in (("retention_timeout", "RETENTION"), ("visibility_timeout", "VISIBILITY"),
                       ("message_delay", "DELAY")):
        if field in body:
            if not _is_int(body[field]):
                raise HttpError(400, f"{field} must be an integer")
            opts += [opt, str(body[field])]
    if "message_deduplication" in body:
        if not isinstance(body["message_deduplication"], bool):
            raise HttpError(400, "message_deduplication must be a boolean")
        opts += ["DEDUP", "yes" if body["message_deduplication"] else "no"]
    return opts


def _raise_for(reply: Any) -> None:
    if isinstance(reply, Error):
        text = str(reply)
        code = text.split(" ", 1)[0]
        if code == "NOQUEUE":
            raise HttpError(404, "queue not found")
        if code == "EXISTS":
            raise HttpError(409, "queue already exists")
        if code == "NOPERM":  # the request's ACL user (docs/security.md)
            raise HttpError(403, text)
        if code in ("OOM", "NOREPL", "LEAVING", "PAUSED", "LOADING"):
            raise HttpError(503, text, {"Retry-After": RETRY_AFTER_S})
        raise HttpError(400, text)


async def _read_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The body, at most ``limit`` bytes, within BODY_TIMEOUT_S. A larger body is 413; it is
    still read and dropped up to DRAIN_LIMIT, so the client, still sending, gets the answer
    instead of a connection reset (beyond that the connection is closed after the answer)."""
    length = request.headers.get("content-length")
    if length is not None and not (length.isascii() and length.isdigit()):
        raise HttpError(400, "bad Content-Length")
    declared = int(length) if length is not None else None
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(BODY_TIMEOUT_S) as scope:
        try:
            if declared is not None and declared > limit:
                if declared <= DRAIN_LIMIT:
                    async for _ in request.stream():
                        pass
                raise HttpError(413, f"body larger than {limit} bytes")
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    if size <= DRAIN_LIMIT:
                        async for more in request.stream():
                            size += len(more)
                            if size > DRAIN_LIMIT:
                                break
                    raise HttpError(413, f"body larger than {limit} bytes")
                chunks.append(chunk)
        except ClientDisconnect:
            raise HttpError(400, "client disconnected before the end of the body") from None
    if scope.cancelled_caught:
        raise HttpError(408, f"body not received within {BODY_TIMEOUT_S:g} s")
    return b"".join(chunks)


async def _json_body(request: Request, empty: Any) -> Any:
    raw = await _read_body(request)
    if not raw.strip():
        return empty
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise HttpError(400, "malformed JSON") from None


def _int_param(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise HttpError(400, f"{name} must be an integer between {low} and {high}")
    return int(raw)


def _same_origin(request: Request) -> bool:
    """A browser's request from another site's page (a form posted there with the user's
    saved Basic credentials) carries that site's Origin: refused. Clients that send no
    Origin (curl, programs) are not browsers and pass."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")


def _peer(request: Request) -> str:
    client = request.client
    return f"http:{client.host}:{client.port}" if client is not None else "http:unknown"


def _name(raw: str) -> bytes:
    name = raw.encode("utf-8", "surrogateescape")
    if not name:
        raise HttpError(404, "queue not found")
    return name


# =============================================================================================
# Routes


class Api:
    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge

    async def _require_queue(self, name: bytes) -> None:
        if self.bridge.policy(name) is None:
            raise HttpError(404, "queue not found")

    # -- queues (mqs) -----------------------------------------------------------------------------

    async def queue(self, request: Request) -> Response:
        name = _name(request.path_params["name"])
        method = request.method
        peer = _peer(request)
        if method == "GET":
            reply = await self.bridge.call("QPOLICY", "GET", name, peer=peer)
            if reply is None:
                raise HttpError(404, "queue not found")
            body = _policy_json(reply)
            body["status"] = self._status(name)
            return JSONResponse(body)
        if method == "DELETE":
            reply = await self.bridge.call("QPOLICY", "GET", name, peer=peer)
            if reply is None:
                raise HttpError(404, "queue not found")
            await self._delete_queue(name, peer)
            return JSONResponse(_policy_json(reply))
        if method == "POST":
            await self._require_queue(name)  # mqs: 404 before parsing the body
        elif self.bridge.policy(name) is not None:
            raise HttpError(409, "queue already exists")
        opts = _queue_options(await _json_body(request, {}))
        reply = await self.bridge.call("QPOLICY", "CREATE" if method == "PUT" else "UPDATE",
                                       name, *opts, peer=peer)
        _raise_for(reply)
        return JSONResponse(_policy_json(reply), status_code=201 if method == "PUT" else 200)

    async def _delete_queue(self, name: bytes, peer: str) -> None:
        from broker import policies

        broker = self.bridge.server.broker

        def purge(reply: Any) -> None:
            if reply == 1:
                policies.purge(broker, name, self.bridge.server.clock.now_ms())

        _raise_for(await self.bridge.call("QPOLICY", "DEL", name, peer=peer, after=purge))

    def _status(self, name: bytes) -> dict[str, int]:
        broker = self.bridge.server.broker
        now = self.bridge.server.clock.now_ms()
        jobs = [j for j in broker.jobs.values()
                if j.queue == name and j.state is not JobState.ACKED]
        q = broker.queues.get(name)
        oldest = min((j.ctime // 1_000_000 for j in jobs), default=now)
        return {"messages": len(jobs), "visible_messages": len(q) if q is not None else 0,
                "oldest_message_age": max(0, (now - oldest) // 1000)}

    async def queues(self, request: Request) -> Response:
        query = request.query_params
        offset = _int_param(query, "offset", 0, 0, 2**31 - 1)
        limit = _int_param(query, "limit", 2**31 - 1, 0, 2**31 - 1)
        total, items = await self.bridge.call("QPOLICY", "LIST", "OFFSET", str(offset),
                                              "LIMIT", str(limit), peer=_peer(request))
        return JSONResponse({"total": total, "queues": [_policy_json(i) for i in items]})

    async def redrive(self, request: Request) -> Response:
        """``POST /queues/<name>/redrive``: QPOLICY REDRIVE in slices of REDRIVE_SLICE, so a
        big dead-letter queue does not hold the node for one long loop turn."""
        if not _same_origin(request):
            raise HttpError(403, "cross-origin request refused")
        name = _name(request.path_params["name"])
        await self._require_queue(name)
        peer = _peer(request)
        job = request.query_params.get("job")
        if job is not None:  # one dead letter (the dashboard's row button)
            job_id = job.encode("utf-8", "surrogateescape")
            if not is_valid(job_id):
                raise HttpError(400, "not a valid message ID (a job ID: D-...)")
            reply = await self.bridge.call("QPOLICY", "REDRIVE", name, "JOB", job_id, peer=peer)
            _raise_for(reply)
            return JSONResponse({"moved": reply})
        limit = _int_param(request.query_params, "count", 2**31 - 1, 1, 2**31 - 1)
        moved = 0
        while moved < limit:
            step = min(REDRIVE_SLICE, limit - moved)
            reply = await self.bridge.call("QPOLICY", "REDRIVE", name, "COUNT", str(step),
                                           peer=peer)
            if isinstance(reply, Error) and moved == 0:
                _raise_for(reply)
            if not isinstance(reply, int):
                break  # a later slice failed: report what moved
            moved += reply
            if reply < step:
                break
            await trio.lowlevel.checkpoint()
        return JSONResponse({"moved": moved})

    # -- messages (mqs) --------------------------------------------------------------------------

    async def messages(self, request: Request) -> Response | Answer:
        target = request.path_params["name"]
        if request.method == "DELETE":
            return await self.delete_message(_peer(request),
                                             target.encode("utf-8", "surrogateescape"), None)
        name = _name(target)
        if request.method == "POST":
            return await self._publish(request, name)
        return await self._receive(request, name)

    async def _publish(self, request: Request, name: bytes) -> Answer:
        await self._require_queue(name)
        body = await _read_body(request)
        return await self.publish(_peer(request), name, body,
                                  request.headers.get("content-type", OCTET),
                                  request.query_params, request.query_params.getlist("after"))

    async def publish(self, peer: str, name: bytes, body: bytes, ctype: str,
                      query: Mapping[str, str] | None = None,
                      after: list[str] | None = None) -> Answer:
        """ADDJOB of ``body`` to queue ``name`` (which has a policy); ``?priority=n``: its
        PRIORITY (docs/semantics.md); ``after``: the job waits until those jobs are acked or
        resolved (ADDJOB's AFTER)."""
        priority = _int_param(query or {}, "priority", 0, 0, MAX_PRIORITY)
        await self._require_queue(name)
        ctype = ctype[:1024]
        if not is_header_value(ctype):
            raise HttpError(400, "Content-Type holds a control character")
        broker = self.bridge.server.broker
        duplicate = False

        def remember(reply: Any) -> None:
            nonlocal duplicate
            duplicate = broker.policies.last_duplicate
            if duplicate or ctype == OCTET or isinstance(reply, Error):
                return
            # A reply, or BLOCKED (replication under way): the job just registered is the
            # newest key of the table either way.
            job_id = reply.encode() if isinstance(reply, str) else next(reversed(broker.jobs))
            broker.policies.set_content_type(broker, job_id, ctype)

        # On a cluster an ADDJOB waits until replicated (at most ADDJOB_TIMEOUT_MS).
        options = ["PRIORITY", str(priority)] if priority else []
        options += [word for parent in after or () for word in ("AFTER", parent)]
        reply = await self.bridge.call("ADDJOB", name, body, str(ADDJOB_TIMEOUT_MS), *options,
                                       peer=peer, after=remember,
                                       wait_s=ADDJOB_TIMEOUT_MS / 1000)
        if isinstance(reply, bytes):  # a blocked ADDJOB's reply, decoded from RESP
            reply = reply.decode("ascii")
        _raise_for(reply)
        if not isinstance(reply, str):
            raise HttpError(503, "not replicated in time", {"Retry-After": RETRY_AFTER_S})
        job_id = str(reply)
        headers = {"X-MQS-MESSAGE-ID": job_id, "X-Message-Id": job_id}
        # As json_answer would render it: a job ID has nothing JSON escapes.
        return Answer(200 if duplicate else 201, b'{"id":"%s"}' % reply.encode(), "application/json",
                      headers)

    async def _receive(self, request: Request, name: bytes) -> Answer:
        async def watch(scope: trio.CancelScope) -> None:
            await _watch_disconnect(request, scope)

        return await self.receive(_peer(request), name, request.query_params, watch)

    async def receive(self, peer: str, name: bytes, query: Mapping[str, str],
                      watch: Callable[[trio.CancelScope], Any] | None = None) -> Answer:
        """GETJOB from queue ``name``; with ``?wait=`` a long poll that ``watch`` (cancelling
        the scope it is given when the client leaves) may end early."""
        await self._require_queue(name)
        wait = _int_param(query, "wait", 0, 0, MAX_WAIT_S)
        batch = "count" in query
        count = _int_param(query, "count", 1, 1, MAX_COUNT)
        args = ["GETJOB", *(("TIMEOUT", str(wait * 1000)) if wait else ("NOHANG",)),
                "COUNT", str(count), "WITHCOUNTERS", "FROM"]
        reply: Any = None  # stays None if the client leaves while waiting
        if wait and watch is not None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, nursery.cancel_scope)
                reply = await self.bridge.call(*args, name, peer=peer, wait_s=wait)
                nursery.cancel_scope.cancel()
        else:
            reply = await self.bridge.call(*args, name, peer=peer, wait_s=wait)
        _raise_for(reply)
        if not isinstance(reply, list) or not reply:  # NULL_ARRAY: nothing within the wait
            return Answer(204)
        types = self.bridge.server.broker.policies.content_types
        try:  # a body the append log holds is a reference in the reply: read it here
            reply = [[*entry[:2], body_of(entry[2]), *entry[3:]] for entry in reply]
        except BodyError as exc:
            raise HttpError(500, str(exc)) from None
        if not batch:
            (_, job_id, body, _, nacks, _, deliveries), = reply
            jid = job_id.decode()
            headers = {"X-MQS-MESSAGE-ID": jid, "X-Message-Id": jid,
                       "X-Receive-Count": str(1 + nacks + deliveries)}
            origin = self.bridge.server.broker.policies.origins.get(job_id)
            if origin is not None:  # a dead letter: where it came from
                headers["X-Original-Message-Id"] = origin[0].decode()
                headers["X-Original-Queue"] = quote(origin[1], safe="")
            return Answer(200, body, types.get(job_id, OCTET), headers)
        return json_answer({"messages": [
            {"id": job_id.decode(), "queue": queue.decode("utf-8", "replace"),
             "content_type": types.get(job_id, OCTET),
             "body_base64": base64.b64encode(body).decode(), "nacks": nacks,
             "additional_deliveries": deliveries}
            for queue, job_id, body, _, nacks, _, deliveries in reply]})

    async def delete_message(self, peer: str, job_id: bytes, queue: bytes | None) -> Answer:
        """ACKJOB; with ``queue``, only a job of that queue (MQ's route)."""
        if queue is not None:
            await self._require_queue(queue)
        if not is_valid(job_id):
            raise HttpError(400, "not a valid message ID (a job ID: D-...; send / as %2F)")
        if queue is not None:
            job = self.bridge.server.broker.jobs.get(job_id)
            if job is None or job.queue != queue:
                raise HttpError(404, "message not found")
        reply = await self.bridge.call("ACKJOB", job_id, peer=peer)
        _raise_for(reply)
        if reply != 1:
            raise HttpError(404, "message not found")
        return Answer(204)

    # -- results (RESOLVE, WAITJOB) ---------------------------------------------------------------

    async def result(self, request: Request) -> Response:
        job_id = request.path_params["id"].encode("utf-8", "surrogateescape")
        if not is_valid(job_id):
            raise HttpError(400, "not a valid message ID (a job ID: D-...; send / as %2F)")
        peer = _peer(request)
        if request.method == "PUT":
            body = await _read_body(request)
            reply = await self.bridge.call("RESOLVE", job_id, body, peer=peer)
            _raise_for(reply)
            return JSONResponse({"resolved": int(reply)})
        wait = _int_param(request.query_params, "wait", 0, 0, MAX_WAIT_S)
        # Without wait: whatever is known now (WAITJOB's shortest timeout).
        timeout = str(wait * 1000) if wait else "1"
        reply = await self.bridge.call("WAITJOB", job_id, "TIMEOUT", timeout, peer=peer,
                                       wait_s=wait)
        if isinstance(reply, Error):
            code = str(reply).split(" ", 1)[0]
            if code == "NOJOB":
                raise HttpError(404, "message not known in the cluster")
            if code in ("EXPIRED", "DELETED", "DEADLETTER"):
                raise HttpError(410, str(reply))
            _raise_for(reply)
        if reply is None:
            return Response(status_code=204)
        return Response(bytes(reply), media_type=OCTET)

    # -- MQ's routes -----------------------------------------------------------------------------

    async def mq_queue(self, request: Request) -> Response:
        name = _name(request.path_params["queue"])
        exists = self.bridge.policy(name) is not None
        if request.method == "GET":
            return Response(status_code=200 if exists else 404)
        if request.method == "PUT":
            await _read_body(request)  # MQ: the body is discarded
            if exists:
                return Response(status_code=200)
            _raise_for(await self.bridge.call("QPOLICY", "CREATE", name, peer=_peer(request)))
            return Response(status_code=201)
        if not exists:
            raise HttpError(404, "queue not found")
        await self._delete_queue(name, _peer(request))
        return Response(status_code=200)

    async def mq_messages(self, request: Request) -> Answer:
        name = _name(request.path_params["queue"])
        if request.method == "POST":
            return await self._publish(request, name)
        return await self._receive(request, name)

    async def mq_message(self, request: Request) -> Answer:
        name = _name(request.path_params["queue"])
        return await self.delete_message(
            _peer(request), request.path_params["id"].encode("utf-8", "surrogateescape"), name)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(OPENAPI)


async def _watch_disconnect(request: Request, scope: trio.CancelScope) -> None:
    """A long poll whose client went away stops waiting (the broker forgets the waiter)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


# =============================================================================================
# The application


def _wrap(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        try:
            response: Response | Answer = await handler(request)
            return response.response() if isinstance(response, Answer) else response
        except HttpError as exc:
            return _error(exc.status, exc.text, exc.headers)

    return endpoint


async def _drain(receive: Receive) -> None:
    """Read and drop a refused request's body (up to DRAIN_LIMIT, within BODY_TIMEOUT_S)
    before answering: hypercorn closes a keep-alive connection, without saying so in the
    answer, when the answer ends before the request's body was read, and the client's next
    request on it then finds the connection gone."""
    size = 0
    with trio.move_on_after(BODY_TIMEOUT_S):
        while size <= DRAIN_LIMIT:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


def make_app(server: Server, api: Api | None = None) -> ASGIApp:
    from node import metrics
    from node.dashboard import Dashboard

    if api is None:
        api = Api(Bridge(server))
    csrf = CsrfTokens()

    def csrf_token() -> str:
        user = REQUEST_USER.get()
        return csrf.token(user) if user is not None else ""

    dashboard = Dashboard(server, csrf_token, REQUEST_USER.get)
    routes = [
        Route("/openapi.json", _wrap(api.openapi), methods=["GET"]),
        # Prometheus metrics, and the dashboard's /, /jobs/... and /static/...
        Route("/metrics", metrics.endpoint(server, dashboard), methods=["GET"]),
        *dashboard.routes(),
        Route("/queues", _wrap(api.queues), methods=["GET"]),
        Route("/queues/{name:path}/redrive", _wrap(api.redrive), methods=["POST"]),
        Route("/queues/{name}", _wrap(api.queue), methods=["GET", "PUT", "POST", "DELETE"]),
        Route("/messages/{name:path}", _wrap(api.messages), methods=["GET", "POST", "DELETE"]),
        Route("/results/{id:path}", _wrap(api.result), methods=["GET", "PUT"]),
        Route("/mq/{queue}", _wrap(api.mq_queue), methods=["GET", "PUT", "DELETE"]),
        Route("/mq/{queue}/messages", _wrap(api.mq_messages), methods=["GET", "POST"]),
        Route("/mq/{queue}/messages/{id:path}", _wrap(api.mq_message), methods=["DELETE"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(404, "no such route")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _error(405, "method not allowed")

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})
    return Auth(app, server.broker.acl, csrf, _drain)
