"""Throw mutated HTTP/1.1 at a node's HTTP API over many connections, then check it is whole.

Usage: python -m tools.fuzz_http [--count 30000] [--connections 8] [--seed N] [--seconds 300]
                                 [--tls] [--port P --http-port H]
                                 (without --port a node is started, with https under --tls)

Requests are the API's routes, those node/http_front.py answers itself and those it hands to
hypercorn, mixed in pipelines, with mutated heads (methods, %-escapes and ``..`` in paths,
huge, negative and duplicate Content-Length, chunked bodies with bad chunks, folded headers,
bare LF, NUL and non-ASCII bytes, oversize heads, missing Host, Expect and Upgrade), bodies
shorter or longer than declared, and connections closed mid-head or mid-body or fed a few
bytes at a time. Before the storm, sentinel jobs go to a queue the fuzzer never names (over
RESP); afterwards the node must answer a well-formed request on a fresh connection (one route
of each kind), hold every sentinel, have logged no caught exception, answered no 5xx, closed
every connection (within 30 s) and kept its memory within ``--rss-growth-mb`` of what it used
once warm (a bound for gross leaks: the node's resident memory grows by some tens of MiB over
30,000 requests, which the Python heap does not show: the allocator's).
Every random choice comes from ``--seed``, printed first, so a failure replays. Bounded by
``--count`` requests and ``--seconds``.
"""

from __future__ import annotations

import argparse
import http.client
import random
import re
import select
import socket
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tools import fuzz_resp, fuzz_tls

QUEUES = [b"f1", b"f2", b"f3"]
CHECK_QUEUE = "fuzz-check"
NUMBERS = [b"0", b"1", b"2", b"9", b"10", b"100", b"-1", b"99999999999999999999", b"1.5",
           b"0x10", b"", b"abc", b"%31", b"+1"]
PARAMS = [b"priority", b"count", b"wait", b"after", b"offset", b"limit", b"job", b"delay"]
# Routes the front answers itself, then those it hands to hypercorn (with the body kind).
FAST = [(b"POST", b"/messages/Q", b"data"), (b"GET", b"/messages/Q", b""),
        (b"DELETE", b"/messages/ID", b""), (b"POST", b"/mq/Q/messages", b"data"),
        (b"GET", b"/mq/Q/messages", b""), (b"DELETE", b"/mq/Q/messages/ID", b"")]
OTHER = [(b"GET", b"/messages/Q?wait=W", b""), (b"POST", b"/messages/Q?after=ID", b"data"),
         (b"GET", b"/messages/Q?count=N", b""), (b"GET", b"/queues", b""),
         (b"GET", b"/queues?offset=N&limit=N", b""), (b"GET", b"/queues/Q", b""),
         (b"PUT", b"/queues/Q", b"json"), (b"POST", b"/queues/Q", b"json"),
         (b"DELETE", b"/queues/Q", b""), (b"POST", b"/queues/Q/redrive", b""),
         (b"GET", b"/results/ID", b""), (b"PUT", b"/results/ID", b"data"),
         (b"GET", b"/mq/Q", b""), (b"PUT", b"/mq/Q", b"json"), (b"GET", b"/openapi.json", b""),
         (b"GET", b"/metrics", b""), (b"GET", b"/", b""), (b"GET", b"/jobs/ID", b""),
         (b"GET", b"/jobs/ID/log", b""), (b"GET", b"/static/S", b""), (b"GET", b"/nowhere", b""),
         (b"OPTIONS", b"*", b""), (b"HEAD", b"/messages/Q", b"")]
METHODS = [b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"PATCH", b"OPTIONS", b"TRACE",
           b"CONNECT", b"PRI", b"get", b"G\x00T", b"", b"POST ", b"\xffPOST", b"X" * 300]
VERSIONS = [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.2", b"http/1.1", b"HTTP/1.1 ", b"HTTP/1", b"",
            b"HTTP/1.1\x00", b"HTTP/01.1"]
ESCAPES = [b"%", b"%2", b"%2F", b"%2f", b"%00", b"%FF", b"%C3%A9", b"%ED%A0%80", b"%G1",
           b"..", b"/..", b"/../", b"//", b"/./", b"%2E%2E", b"\xc3\xa9", b"\xff", b" ", b"#x",
           b"?", b"&", b"=", b"+", b";", b"\\", b"\x00", b"\t"]
JSON_BODIES = [b"", b"{}", b'{"visibility_timeout": 1}', b'{"retention_timeout": -1}',
               b'{"visibility_timeout": "x"}', b"[]", b"null", b"{", b'{"redrive_policy": {}}',
               b'{"message_deduplication": true}', b'{"a": ' * 50 + b"1" + b"}" * 50,
               b"\xff\xfe", b'{"visibility_timeout": 1e999}']
HEADER_NAMES = [b"x-fuzz", b"accept", b"user-agent", b"cookie", b"content-type", b"te",
                b"connection", b"expect", b"upgrade", b"authorization", b"origin",
                b"sec-fetch-site", b"x-csrf-token", b"range", b"if-none-match", b"trailer"]
HEADER_VALUES = [b"", b"x", b"close", b"keep-alive", b"Upgrade", b"100-continue", b"h2c",
                 b"websocket", b"chunked", b"trailers", b"Basic ZGVmYXVsdDo=", b"Basic !!",
                 b"Bearer x", b"Basic " + b"A" * 1000, b"http://evil.example", b"cross-site",
                 b"same-origin", b"text/plain", b"application/json", b"\x00", b"\xe9",
                 b"bytes=0-1", b" x ", b"x" * 5000]
STATUS = re.compile(rb"HTTP/1\.[01] (\d\d\d) ")
MESSAGE_ID = re.compile(rb"x-message-id: (D-[0-9A-Za-z+/=-]+)", re.IGNORECASE)


class Fuzzer:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.ids: list[bytes] = [b"D-00000000-000000000000000000000000-05a1"]

    def _fill(self, template: bytes) -> bytes:
        rng = self.rng
        out = template
        while b"Q" in out:
            out = out.replace(b"Q", rng.choice(QUEUES) if rng.random() < 0.9
                              else rng.choice((b"", b"nosuch", b"f%31", b"%2F", b"\xc3\xa9")), 1)
        while b"ID" in out:
            job_id = rng.choice(self.ids)
            if rng.random() < 0.8:
                job_id = quote(job_id, safe="").encode()
            elif rng.random() < 0.5:
                job_id = rng.randbytes(rng.randint(0, 12)).hex().encode()
            out = out.replace(b"ID", job_id, 1)
        out = out.replace(b"=W", b"=" + rng.choice((b"0", b"1", b"2", b"abc", b"-1", b"61")))
        while b"=N" in out:
            out = out.replace(b"=N", b"=" + rng.choice(NUMBERS), 1)
        return out.replace(b"/S", b"/" + rng.choice((b"app.js", b"style.css", b"..%2F..%2Fx",
                                                     b"nope")))

    def _target(self, template: bytes) -> bytes:
        rng = self.rng
        target = self._fill(template)
        if rng.random() < 0.3:
            target += b"?" if b"?" not in target else b"&"
            target += b"&".join(rng.choice(PARAMS) + b"=" + rng.choice(NUMBERS)
                                for _ in range(rng.randint(1, 3)))
        if rng.random() < 0.15:
            for _ in range(rng.randint(1, 3)):
                at = rng.randint(1, max(1, len(target)))
                target = target[:at] + rng.choice(ESCAPES) + target[at:]
        if rng.random() < 0.02:
            target = b"http://127.0.0.1" + target  # absolute form
        if rng.random() < 0.01:
            target += b"/" + b"a" * rng.choice((1000, 70_000))
        return target

    def _body(self, kind: bytes) -> bytes:
        rng = self.rng
        if kind == b"json":
            return rng.choice(JSON_BODIES)
        if kind == b"data" or rng.random() < 0.05:
            return rng.randbytes(rng.choice((0, 1, 5, 100, 3000, 20_000)))
        return b""

    def request(self, mutate: bool) -> bytes:
        """One request of a random route, well-formed or with parts of it mutated."""
        rng = self.rng
        method, template, kind = rng.choice(FAST if rng.random() < 0.6 else OTHER)
        if mutate and rng.random() < 0.15:
            method = rng.choice(METHODS)
        target = self._target(template)
        version = rng.choice(VERSIONS) if mutate and rng.random() < 0.1 else b"HTTP/1.1"
        body = self._body(kind)
        headers: list[bytes] = []
        if not (mutate and rng.random() < 0.1):
            headers.append(b"Host: " + (b"127.0.0.1" if rng.random() < 0.95 else
                                        rng.choice((b"", b"a b", b"\xff", b"x" * 300))))
        if rng.random() < 0.3:
            headers.append(b"Content-Type: " + rng.choice((b"text/plain", b"application/json",
                                                           b"\xe9", b"x" * 2000)))
        framing = "length" if not mutate else rng.choice(
            ("length", "length", "none", "short", "long", "duplicate", "conflict", "bad",
             "chunked", "bad-chunked", "both"))
        data = body
        if framing in ("length", "short", "long", "duplicate", "conflict", "both"):
            if body or method in (b"POST", b"PUT") or rng.random() < 0.2:
                headers.append(b"Content-Length: %d" % len(body))
            if framing == "short":  # fewer bytes than declared: the next request is body
                data = body[:rng.randrange(len(body) + 1)] if body else b""
                headers[-1:] = [b"Content-Length: %d" % (len(body) + rng.choice((1, 10, 5000)))]
            elif framing == "long":  # more than declared: the rest is the next request
                data = body + rng.randbytes(rng.choice((1, 4, 50)))
            elif framing == "duplicate":
                headers.append(b"Content-Length: %d" % len(body))
            elif framing == "conflict":
                headers.append(b"Content-Length: %d" % (len(body) + 1))
        if framing == "bad":
            headers.append(b"Content-Length: " + rng.choice(
                (b"-1", b"+5", b" 5", b"5 5", b"0x10", b"99999999999999999999999", b"",
                 b"1e3", b"\xd9\xa5", b"18446744073709551616", b"\x00")))
        if framing in ("chunked", "bad-chunked", "both"):
            headers.append(b"Transfer-Encoding: " + rng.choice(
                (b"chunked", b"chunked", b"gzip, chunked", b"chunked, gzip", b"Chunked",
                 b"identity", b" chunked")))
            data = self._chunks(body, framing == "bad-chunked")
        for _ in range(rng.choice((0, 0, 0, 1, 2, 5)) if mutate else 0):
            headers.append(rng.choice(HEADER_NAMES) + b": " + rng.choice(HEADER_VALUES))
        if mutate and rng.random() < 0.05:
            headers += [b"x-many-%d: y" % i for i in range(rng.choice((100, 2000)))]
        if mutate and rng.random() < 0.02:
            headers.append(b"x-huge: " + b"h" * rng.choice((60_000, 70_000, 200_000)))
        head = b"\r\n".join([method + b" " + target + b" " + version] + headers) + b"\r\n\r\n"
        if mutate and rng.random() < 0.3:
            head = self._damage_head(head)
        return head + data

    def _chunks(self, body: bytes, bad: bool) -> bytes:
        rng = self.rng
        out = []
        at = 0
        while at < len(body):
            n = rng.randint(1, max(1, len(body) - at))
            out.append(b"%x\r\n" % n + body[at:at + n] + b"\r\n")
            at += n
        out.append(b"0\r\n\r\n")
        if bad:
            i = rng.randrange(len(out))
            out[i] = rng.choice((b"zz\r\n", b"-1\r\n", b"ffffffffffffffffff\r\n", b"5\r\nab",
                                 b"3;ext=1\r\nabc\r\n", b"0\r\nx-trailer: 1\r\n\r\n", b"",
                                 b"1\nx\n", b"3\r\nabcdef\r\n"))
        return b"".join(out)

    def _damage_head(self, head: bytes) -> bytes:
        rng = self.rng
        kind = rng.randrange(7)
        if kind == 0:  # bare LF line endings
            return head.replace(b"\r\n", b"\n", rng.randint(1, 4))
        if kind == 1:  # an obsolete folded header line
            return head[:-2] + b"X-Folded: a\r\n  b\r\n\tc\r\n\r\n"
        if kind == 2:  # a NUL or a non-ASCII byte somewhere
            at = rng.randrange(len(head) - 4)
            return head[:at] + rng.choice((b"\x00", b"\xff", b"\x80", b"\x7f")) + head[at:]
        if kind == 3:  # a header line with no colon, or a space before the colon
            return head[:-2] + rng.choice((b"NoColon\r\n", b"Host : x\r\n", b": v\r\n",
                                           b"\x00: v\r\n")) + b"\r\n"
        if kind == 4:  # flipped bytes
            data = bytearray(head)
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            return bytes(data)
        if kind == 5:  # a lone CR, or the blank line missing its CR
            return head[:-4] + rng.choice((b"\r\r\n", b"\n\r\n", b"\r\n\n", b"\r\n\r\r\n"))
        return rng.randbytes(rng.randint(1, 40)) + head  # garbage before the request line

    def ending(self) -> bytes:
        """How a connection ends: cleanly, mid-head, mid-body or in garbage."""
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            return b""
        request = self.request(rng.random() < 0.5)
        if r < 0.7:
            return request[:rng.randrange(len(request) + 1)]
        if r < 0.85:
            head_end = request.find(b"\r\n\r\n")
            return request[:max(head_end + 4, len(request) - rng.randint(1, 100))]
        return rng.randbytes(rng.randint(1, 200))


class Conn:
    """One fuzzing connection: its socket, its TLS (``--tls``), what it read of the
    answers (status lines are counted across reads)."""

    def __init__(self, sock: socket.socket, tls: fuzz_tls.TlsClient | None) -> None:
        self.sock, self.tls = sock, tls
        self.tail = b""
        self.suspect = False  # sent a mutated request: the node may have closed it since
        self.sent = self.answered = 0  # requests, and status lines read

    def seal(self, data: bytes) -> bytes:
        """``data`` as this connection sends it: as records under TLS."""
        return data if self.tls is None else self.tls.seal(data)

    def read(self, stats: dict[str, Any], fuzz: Fuzzer) -> bool:
        """Read what is there; False at the node's end of the connection."""
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            if self.tls is not None:
                data = self.tls.open(data)
            # The tail is shorter than a status line: a match is never counted twice.
            text = self.tail + data
            for m in STATUS.finditer(text):
                code = m.group(1).decode()
                stats["status"][code] = stats["status"].get(code, 0) + 1
                self.answered += 1
            self.tail = text[-12:]
            for m in MESSAGE_ID.finditer(data):
                if len(fuzz.ids) < 1000:
                    fuzz.ids.append(m.group(1))
                else:
                    fuzz.ids[fuzz.rng.randrange(1000)] = m.group(1)


def _settle(conn: Conn, stats: dict[str, Any], fuzz: Fuzzer, seconds: float) -> bool:
    """Read answers until every request sent has one, the node is quiet for 0.2 s or
    ``seconds`` pass (a bad request loses those behind it, a long poll takes its time);
    False if the node closed the connection. Closing a connection with requests unread
    would make the kernel drop them: the node would never see most of the storm."""
    deadline = time.monotonic() + seconds
    while conn.answered < conn.sent:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([conn.sock], [], [], min(left, 0.2))[0]:
            return True
        if not conn.read(stats, fuzz):
            return False
    return True


def _send(conn: Conn, data: bytes, stats: dict[str, Any], fuzz: Fuzzer,
          slow: bool = False, timeout: float = 2.0) -> bool:
    """Send ``data`` (already sealed under TLS) while reading the answers; False if the node
    closed the connection or took longer than ``timeout``. ``slow``: the first bytes go a few
    at a time."""
    view = memoryview(data)
    deadline = time.monotonic() + timeout
    trickle = 400 if slow else 0
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        readable, writable, _ = select.select([conn.sock], [conn.sock], [], left)
        if readable and not conn.read(stats, fuzz):
            return False
        if writable:
            piece = view
            if trickle > 0:
                piece = view[:fuzz.rng.randint(1, 16)]
                trickle -= len(piece)
                time.sleep(0.001)
            try:
                sent = conn.sock.send(piece)
            except BlockingIOError:
                continue
            except OSError:
                return False
            view = view[sent:]
    return True


class Target:
    """Where the storm goes: the node's HTTP port, plain or TLS (with contexts to pick)."""

    def __init__(self, port: int, contexts: list[ssl.SSLContext] | None) -> None:
        self.port, self.contexts = port, contexts

    def connect(self, rng: random.Random) -> Conn | None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.setblocking(False)
        if self.contexts is None:
            return Conn(sock, None)
        tls = fuzz_tls.TlsClient(sock, rng.choice(self.contexts))
        if not tls.handshake():
            sock.close()
            return None
        return Conn(sock, tls)


def storm(target: Target, count: int, connections: int, fuzz: Fuzzer, seconds: float,
          stats: dict[str, Any], progress: bool = False) -> None:
    """Send ``count`` requests in pipelined batches over rotating connections, reading the
    answers as they come and waiting for them only before a connection takes more than a
    few dozen or is closed (a long poll must not stall the storm)."""
    rng = fuzz.rng
    deadline = time.monotonic() + seconds
    conns: list[Conn | None] = [None] * connections
    stop = stats["requests"] + count
    next_report = stats["requests"] + 5_000
    while stats["requests"] < stop and time.monotonic() < deadline:
        slot = rng.randrange(connections)
        conn = conns[slot]
        if conn is not None and (conn.suspect or conn.sent - conn.answered > 20):
            # Do not pipeline into a connection the node closed after a bad request.
            conn.suspect = False
            if not _settle(conn, stats, fuzz, 1.0 if conn.sent - conn.answered > 20 else 0):
                conn.sock.close()
                conn = conns[slot] = None
        if conn is None:
            try:
                conn = target.connect(rng)
            except OSError as exc:
                stats["refused"] = f"the node stopped accepting after {stats['requests']} " \
                                   f"requests: {exc}"
                break
            stats["connections"] += 1
            if conn is None:
                stats["handshakes_failed"] += 1
                continue
            conns[slot] = conn
        n = min(rng.choice((1, 1, 2, 3, 5, 10)), stop - stats["requests"])
        # Mutations mostly last in a pipeline: a bad request ends the connection at the node
        # (hypercorn's 400), and what follows it would be lost.
        mutated = [rng.random() < (0.4 if i == n - 1 else 0.08) for i in range(n)]
        conn.suspect = any(mutated)
        batch = b"".join(fuzz.request(m) for m in mutated)
        stats["requests"] += n
        conn.sent += n
        end = rng.random() < 0.15
        if end and rng.random() < 0.8 and _send(conn, conn.seal(batch), stats, fuzz):
            # Mostly once the node has answered what came before: the end tests a close
            # mid-request, not a storm of requests dropped unread.
            _settle(conn, stats, fuzz, 1.0)
            batch = b""
        if end:
            batch = conn.seal(batch + fuzz.ending())
            if conn.tls is not None and rng.random() < 0.3:
                batch, _ = fuzz_tls.damage(rng, batch, b"", b"GET / HTTP/1.1\r\n\r\n")
            elif conn.tls is not None and rng.random() < 0.5:
                batch += conn.tls.close_notify()
        else:
            batch = conn.seal(batch)
        if not _send(conn, batch, stats, fuzz, rng.random() < 0.005):
            end = True
        conn.read(stats, fuzz)
        if end:
            stats["closes"] += 1
            conn.sock.close()
            conns[slot] = None
        if progress and stats["requests"] >= next_report:
            next_report += 5_000
            print(f"  {stats['requests']} requests over {stats['connections']} connections",
                  flush=True)
    for conn in conns:
        if conn is not None:
            conn.sock.close()


def check_http(port: int, context: ssl.SSLContext | None) -> list[str]:
    """One route of each kind on a fresh connection: a message published, received and
    deleted through the front, the OpenAPI document through hypercorn."""
    problems = []
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        conn.request("POST", f"/messages/{CHECK_QUEUE}", body=b"check body")
        posted = conn.getresponse()
        posted.read()
        conn.request("GET", f"/messages/{CHECK_QUEUE}")
        got = conn.getresponse()
        body = got.read()
        if posted.status != 201 or got.status != 200 or body != b"check body":
            problems.append(f"the message routes answer {posted.status}, {got.status} "
                            f"{body[:100]!r}")
        else:
            conn.request("DELETE", "/messages/" + quote(got.headers["x-message-id"], safe=""))
            deleted = conn.getresponse()
            deleted.read()
            if deleted.status != 204:
                problems.append(f"DELETE of a message answers {deleted.status}")
        conn.request("GET", "/openapi.json")
        doc = conn.getresponse()
        if doc.status != 200 or b"openapi" not in doc.read():
            problems.append(f"GET /openapi.json answers {doc.status}")
    except (OSError, http.client.HTTPException) as exc:
        problems.append(f"a well-formed request on a fresh connection failed: {exc!r}")
    finally:
        conn.close()
    return problems


def run(resp_port: int, http_port: int, pid: int, args: argparse.Namespace, seed: int,
        contexts: list[ssl.SSLContext] | None, check_context: ssl.SSLContext | None
        ) -> tuple[dict[str, Any], list[str]]:
    """Sentinels, a warm-up, the storm, the checks: what was done and what is wrong."""
    for queue in [q.decode() for q in QUEUES] + [CHECK_QUEUE]:
        fuzz_resp.call(resp_port, "QPOLICY", "CREATE", queue)
    sentinels = fuzz_resp.add_sentinels(resp_port)
    before = fuzz_resp.commands_processed(resp_port)
    fuzz = Fuzzer(seed)
    target = Target(http_port, contexts)
    stats: dict[str, Any] = {"requests": 0, "connections": 0, "closes": 0,
                             "handshakes_failed": 0, "status": {}}
    fds0 = fuzz_resp.process_use(pid)[1]
    # Warm: what the node allocates once (its HTTP stack's caches) is not growth.
    storm(target, max(1, args.count // 10), args.connections, fuzz, args.seconds, stats)
    fds_warm = fuzz_resp.settled_fds(pid, fds0, 15)
    rss_warm = fuzz_resp.process_use(pid)[0]
    storm(target, args.count - stats["requests"], args.connections, fuzz, args.seconds, stats,
          progress=True)
    problems = []
    if "refused" in stats:
        problems.append(stats["refused"])
    problems += check_http(http_port, check_context)
    problems += fuzz_resp.check_whole(resp_port, sentinels)
    # A long poll (a wait of 10 s at most here) holds its connection until it ends when
    # hypercorn reads no further (a request pipelined behind it), and the machine may be
    # busy: 30 s, far below the hours a leaked connection stays.
    fds = fuzz_resp.settled_fds(pid, fds0, 30)
    rss = fuzz_resp.process_use(pid)[0]
    stats["rss_warm_mb"], stats["rss_mb"] = rss_warm >> 20, rss >> 20
    if fds > fds0:
        problems.append(f"{fds - fds0} descriptors still open 30 s after every connection "
                        f"closed ({fds0} before, {fds_warm} after the warm-up)")
    if rss - rss_warm > args.rss_growth_mb << 20:
        problems.append(f"resident memory grew from {rss_warm >> 20} to {rss >> 20} MiB")
    # 501 and 505 answer a transfer coding or an HTTP version the node does not speak.
    errors = {code: n for code, n in stats["status"].items()
              if code.startswith("5") and code not in ("501", "505")}
    if errors:
        problems.append(f"server errors answered: {errors}")
    stats["executed"] = fuzz_resp.commands_processed(resp_port) - before
    return stats, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    fuzz_resp.add_run_options(ap, 30_000)
    ap.add_argument("--tls", action="store_true", help="https (http-tls yes)")
    ap.add_argument("--rss-growth-mb", type=int, default=128)
    ap.add_argument("--port", type=int, default=None, help="fuzz a running node's RESP port...")
    ap.add_argument("--http-port", type=int, default=None, help="... and its HTTP port")
    ap.add_argument("--ca", default=None, help="the running node's CA (with --tls)")
    args = ap.parse_args(argv)
    seed = fuzz_resp.chosen_seed(args)
    if args.port is not None:
        if args.http_port is None or (args.tls and args.ca is None):
            ap.error("--port needs --http-port (and --ca with --tls)")
        contexts = check = None
        if args.tls:
            check = fuzz_tls.trusting(args.ca)
            contexts = [check]
        pid = fuzz_resp.info_int(args.port, "server", "process_id")
        stats, problems = run(args.port, args.http_port, pid, args, seed, contexts, check)
    else:
        from tests.support.server import ServerProcess, free_port

        with tempfile.TemporaryDirectory(prefix="fuzz-http-") as tmp:
            directives: dict[str, Any] = {"http_port": free_port(), "appendonly": "yes"}
            contexts = check = None
            if args.tls:
                certs = fuzz_tls.make_certs(Path(tmp))
                directives.update(http_tls="yes", **fuzz_tls.node_files(certs))
                contexts = fuzz_tls.client_contexts(certs)
                check = contexts[-1]
            with ServerProcess(**directives) as srv:
                http_port = int(srv.directives["http-port"])
                _wait_http(http_port)
                assert srv.proc is not None
                stats, problems = run(srv.port, http_port, srv.proc.pid, args, seed, contexts,
                                      check)
                problems += srv.audit()
                log = srv.log()
                for marker in ("Traceback", "Error in ASGI"):
                    if marker in log:
                        at = log.index(marker)
                        problems.append(f"the node logged:\n{log[max(0, at - 300):at + 12_000]}")
                        break
                if problems:
                    print(log[-3000:], flush=True)
    statuses = " ".join(f"{k}:{v}" for k, v in sorted(stats["status"].items()))
    print(f"answers {statuses}", flush=True)
    print(f"memory {stats.get('rss_warm_mb')} -> {stats.get('rss_mb')} MiB", flush=True)
    for p in problems:
        print(f"PROBLEM: {p}", flush=True)
    print(f"{stats['requests']} requests, {stats['executed']} commands executed by the node, "
          f"{sum(stats['status'].values())} answers, {stats['connections']} connections, "
          f"{stats['closes']} closed abruptly", flush=True)
    return 1 if problems else 0


def _wait_http(port: int, timeout: float = 15.0) -> None:
    """Until the HTTP port accepts (it opens after the RESP port)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
