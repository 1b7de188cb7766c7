"""Throw fuzzed RESP at a node over many connections, then check it is still whole.

Usage: python -m tools.fuzz_resp [--count 200000] [--connections 8] [--seed N] [--seconds 300]
                                 [--tls] [--port P]   (without --port a node is started and
                                                       checked)

Inputs are valid Disque commands with mutated arguments (huge, negative, non-numeric numbers,
random options, random bytes), raw garbage, truncated and split frames, inline commands and
pipelines; connections are closed abruptly, sometimes mid-frame. Before the storm a set of
sentinel jobs is added on a queue the fuzzer never names; after it the node must answer PING on
a fresh connection, still hold every sentinel, and (when this program started it) restart from
its log with them. Every random choice comes from ``--seed``, printed first, so a failure
replays. Bounded by ``--count`` inputs and ``--seconds``.

``--tls`` sends the same inputs to the node's ``tls-port`` (TLSv1.2 and 1.3, with and without
a client certificate under ``tls-auth-clients optional``), and damages the records too
(tools/fuzz_tls.py): records split at random bytes and sent a few at a time, cut (the
connection then dropped without close_notify), a flipped bit, a length that lies, plaintext
RESP after the handshake, a second ClientHello, records of other types; some connections send
garbage or a cut ClientHello instead of a handshake.
"""

from __future__ import annotations

import argparse
import random
import select
import socket
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from protocol.resp import encode_command
from tools import fuzz_tls

SENTINEL_QUEUE = "fuzz-sentinel-queue"
SENTINELS = 50
# Commands that would legitimately end the run or wipe the sentinels: never sent.
FORBIDDEN = {b"shutdown", b"debug", b"flushall", b"config set", b"cluster reset"}
QUEUES = [b"f1", b"f2", b"f3", b""]
JOB_ID = b"D-00000000-000000000000000000000000-05a1"
NUMBERS = [b"0", b"1", b"-1", b"4294967295", b"4294967296", b"9223372036854775807",
           b"9223372036854775808", b"-9223372036854775808", b"99999999999999999999", b"1.5",
           b"0x10", b" 1", b"01", b"", b"abc", b"100"]
OPTIONS = [b"REPLICATE", b"DELAY", b"RETRY", b"TTL", b"MAXLEN", b"ASYNC", b"NOHANG",
           b"TIMEOUT", b"COUNT", b"WITHCOUNTERS", b"FROM", b"BUSYLOOP", b"MINLEN", b"MAXLEN",
           b"IMPORTRATE", b"QUEUE", b"STATE", b"REPLY", b"all", b"in", b"out", b"bcast",
           # trisque's own: ADDJOB's, and QPOLICY's (docs/semantics.md, docs/policies.md)
           b"PRIORITY", b"AFTER", b"BACKOFF", b"MAXINFLIGHT", b"RATE", b"DEDUP", b"REDRIVE",
           b"VISIBILITY", b"yes", b"no"]
TEMPLATES: list[list[bytes]] = [
    [b"ADDJOB", b"Q", b"body", b"N"], [b"ADDJOB", b"Q", b"body", b"0", b"O", b"N"],
    [b"GETJOB", b"NOHANG", b"COUNT", b"N", b"FROM", b"Q"], [b"GETJOB", b"TIMEOUT", b"N", b"FROM", b"Q"],
    [b"ACKJOB", b"ID"], [b"FASTACK", b"ID"], [b"NACK", b"ID"], [b"WORKING", b"ID"],
    [b"ENQUEUE", b"ID"], [b"DEQUEUE", b"ID"], [b"DELJOB", b"ID"], [b"SHOW", b"ID"],
    [b"QLEN", b"Q"], [b"QSTAT", b"Q"], [b"QPEEK", b"Q", b"N"], [b"QSCAN", b"N", b"O", b"N"],
    [b"JSCAN", b"N", b"O", b"N"], [b"PAUSE", b"Q", b"O"], [b"HELLO"], [b"HELLO", b"N"],
    [b"INFO"], [b"INFO", b"O"], [b"PING"], [b"TIME"], [b"CLIENT", b"LIST"],
    [b"CLIENT", b"SETNAME", b"body"], [b"CONFIG", b"GET", b"*"], [b"CLUSTER", b"INFO"],
    [b"CLUSTER", b"NODES"], [b"COMMAND"], [b"BGREWRITEAOF"], [b"ECHO", b"body"], [b"SELECT", b"N"],
    # The job-semantics extensions: each parser reached with its own options.
    [b"ADDJOB", b"Q", b"body", b"0", b"PRIORITY", b"N"],
    [b"ADDJOB", b"Q", b"body", b"0", b"AFTER", b"ID"],
    [b"ADDJOB", b"Q", b"body", b"0", b"PRIORITY", b"N", b"AFTER", b"ID", b"AFTER", b"ID"],
    [b"RESOLVE", b"ID", b"body"], [b"WAITJOB", b"ID"], [b"WAITJOB", b"ID", b"TIMEOUT", b"N"],
    [b"QPOLICY", b"CREATE", b"Q", b"O", b"N"], [b"QPOLICY", b"SET", b"Q", b"BACKOFF", b"N", b"N"],
    [b"QPOLICY", b"SET", b"Q", b"MAXINFLIGHT", b"N"], [b"QPOLICY", b"SET", b"Q", b"RATE", b"N"],
    [b"QPOLICY", b"SET", b"Q", b"DEDUP", b"O"], [b"QPOLICY", b"GET", b"Q"],
    # ACL users: rules, lookups and logins as other users (the default user never named: a
    # rule on it could lock the checks after the storm out).
    [b"ACL", b"SETUSER", b"U", b"R", b"R", b"R"], [b"ACL", b"SETUSER", b"U", b"R", b"O"],
    [b"ACL", b"GETUSER", b"U"], [b"ACL", b"DELUSER", b"U"], [b"ACL", b"LIST"],
    [b"ACL", b"USERS"], [b"ACL", b"WHOAMI"], [b"ACL", b"CAT"], [b"ACL", b"CAT", b"O"],
    [b"ACL", b"LOG", b"N"], [b"ACL", b"GENPASS", b"N"], [b"ACL", b"DRYRUN", b"U", b"R", b"Q"],
    [b"AUTH", b"U", b"body"], [b"AUTH", b"body"], [b"HELLO", b"3", b"AUTH", b"U", b"body"],
    # Back to the default user (no password, so any password logs in): a connection left
    # logged in as a fuzzed user would be denied most of what follows it.
    [b"AUTH", b"default", b"body"], [b"AUTH", b"default", b"body"],
]
USERS = [b"fuzz", b"fuzz2", b"alice"]
RULES = [b"on", b"off", b">pw", b"<pw", b"#" + b"ab" * 32, b"!" + b"ab" * 32, b"nopass",
         b"resetpass", b"+@all", b"-@all", b"+@jobs", b"-@admin", b"+ADDJOB", b"-GETJOB",
         b"+CLUSTER|INFO", b"~q*", b"~*", b"allkeys", b"resetkeys", b"allcommands",
         b"nocommands", b"reset", b"+@nosuch", b"~", b">"]


class Fuzzer:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def _arg(self, slot: bytes) -> bytes:
        rng = self.rng
        if rng.random() < 0.1:
            return rng.randbytes(rng.randint(0, 12))
        if slot == b"Q":
            return rng.choice(QUEUES)
        if slot == b"N":
            return rng.choice(NUMBERS)
        if slot == b"O":
            return rng.choice(OPTIONS)
        if slot == b"ID":
            return JOB_ID if rng.random() < 0.7 else rng.randbytes(40)
        if slot == b"body":
            return rng.randbytes(rng.choice((0, 3, 100, 5000)))
        if slot == b"U":
            return rng.choice(USERS)
        if slot == b"R":
            return rng.choice(RULES)
        return slot

    def command(self) -> list[bytes]:
        rng = self.rng
        argv = [self._arg(a) if i else a for i, a in enumerate(rng.choice(TEMPLATES))]
        for _ in range(rng.choice((0, 0, 1, 2, 4))):
            argv.insert(rng.randint(1, len(argv)), self._arg(rng.choice((b"O", b"N", b"Q"))))
        if rng.random() < 0.05:
            argv[0] = argv[0].lower()
        return argv

    def input(self) -> bytes:
        """One fuzzed command: a frame with mutated arguments, or the same as an inline line."""
        argv = self.command()
        name = b" ".join(argv[:2]).lower()
        if any(name.startswith(f) for f in FORBIDDEN) or (
                argv[0].lower() == b"acl" and any(a.lower() == b"default" for a in argv)):
            argv = [b"PING"]
        if self.rng.random() < 0.1:
            words = [a for a in argv if a and not any(c in a for c in b" \r\n'\"\\")]
            return b" ".join(words) + b"\r\n"
        return encode_command(*argv)

    def ending(self) -> bytes:
        """How a connection ends: cleanly, mid-frame, in a damaged frame or in garbage. The
        node closes the connection after a protocol error, so this comes last."""
        rng = self.rng
        frame = self.input()
        r = rng.random()
        if r < 0.3:
            return b""
        if r < 0.6:
            return frame[: rng.randint(0, len(frame))]
        if r < 0.8:
            data = bytearray(frame)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            return bytes(data)
        return rng.randbytes(rng.randint(1, 64))


def _send_reading(sock: socket.socket, data: bytes, timeout: float = 2.0) -> bool:
    """Send ``data`` while reading the replies, so neither side waits on a full buffer; False
    if the node closed the connection or took longer than ``timeout``."""
    view = memoryview(data)
    deadline = time.monotonic() + timeout
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        readable, writable, _ = select.select([sock], [sock], [], left)
        if readable:
            _drain(sock)
        if writable:
            try:
                sent = sock.send(view)
            except BlockingIOError:
                continue
            except OSError:
                return False
            view = view[sent:]
    return True


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(1 << 16):
            pass
    except OSError:
        pass


def _send_split(sock: socket.socket, data: bytes, rng: random.Random) -> bool:
    """Send ``data`` cut at random bytes, a few milliseconds apart (at most 40 pieces: the
    rest goes at once)."""
    at = 0
    for _ in range(40):
        if at >= len(data):
            return True
        step = rng.choice((1, 2, 5, 13, 100, 1000))
        if not _send_reading(sock, data[at:at + step]):
            return False
        at += step
        time.sleep(0.001)
    return _send_reading(sock, data[at:])


def _tls_connect(port: int, fuzz: Fuzzer, contexts: list[ssl.SSLContext],
                 stats: dict[str, int]) -> fuzz_tls.TlsClient | None:
    """A TLS connection with its handshake done; None if it was one of those that send
    garbage or a cut ClientHello instead (closed), or the node refused the handshake."""
    rng = fuzz.rng
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setblocking(False)
    if rng.random() < 0.03:
        hello = fuzz_tls.client_hello(rng.choice(contexts))
        junk = rng.choice((hello[:rng.randrange(len(hello))], rng.randbytes(rng.randint(1, 300)),
                           fuzz.input(), hello + hello,
                           bytes((22, 3, 1)) + rng.randbytes(rng.randint(0, 100))))
        _send_reading(sock, junk, 0.5)
        _drain(sock)
        sock.close()
        stats["bad_handshakes"] += 1
        return None
    tls = fuzz_tls.TlsClient(sock, rng.choice(contexts))
    if not tls.handshake():
        sock.close()
        stats["handshakes_failed"] += 1
        return None
    return tls


def storm(port: int, count: int, connections: int, seed: int, seconds: float,
          progress: bool = False, contexts: list[ssl.SSLContext] | None = None,
          ) -> dict[str, int]:
    """Send ``count`` inputs in batches over rotating connections, never waiting for replies
    (a blocked GETJOB must not stall the storm); what was done. With ``contexts``, over TLS
    with damaged records too."""
    fuzz = Fuzzer(seed)
    rng = fuzz.rng
    deadline = time.monotonic() + seconds
    socks: list[socket.socket | None] = [None] * connections
    tlss: list[fuzz_tls.TlsClient | None] = [None] * connections
    stats = {"inputs": 0, "connections": 0, "abrupt_closes": 0, "bad_handshakes": 0,
             "handshakes_failed": 0, "damaged": 0}
    hello = fuzz_tls.client_hello(contexts[0]) if contexts else b""
    next_report = 10_000
    while stats["inputs"] < count and time.monotonic() < deadline:
        slot = rng.randrange(connections)
        sock = socks[slot]
        tls = tlss[slot]
        if sock is None:
            try:
                if contexts:
                    tls = _tls_connect(port, fuzz, contexts, stats)
                    if tls is None:
                        continue
                    sock = tls.sock
                else:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                    sock.setblocking(False)  # with a timeout, recv would wait anyway
            except OSError as exc:
                stats["refused"] = 1
                print(f"  the node stopped accepting after {stats['inputs']} inputs: {exc}",
                      flush=True)
                break
            socks[slot], tlss[slot] = sock, tls
            stats["connections"] += 1
        n = min(rng.randint(1, 20), count - stats["inputs"])
        batch = b"".join(fuzz.input() for _ in range(n))
        stats["inputs"] += n
        end = rng.random() < 0.15
        if end:
            batch += fuzz.ending()
        split = False
        if tls is not None:
            plain = batch
            batch = tls.seal(plain)
            if end and rng.random() < 0.6:
                batch, _ = fuzz_tls.damage(rng, batch, hello, plain)
                stats["damaged"] += 1
            elif end and rng.random() < 0.5:
                batch += tls.close_notify()
            split = rng.random() < 0.01
        sent = _send_split(sock, batch, rng) if split else _send_reading(sock, batch)
        if not sent:
            end = True  # closed by the node (a protocol error) or too slow to take it
        _drain(sock)
        if end:
            stats["abrupt_closes"] += 1
            sock.close()
            socks[slot] = tlss[slot] = None
        if progress and stats["inputs"] >= next_report:
            next_report += 10_000
            print(f"  {stats['inputs']} inputs over {stats['connections']} connections",
                  flush=True)
    for sock in socks:
        if sock is not None:
            sock.close()
    return stats


def call(port: int, *args: Any) -> Any:
    from tests.support.server import send_command

    return send_command(port, *args, timeout=10)


def sentinel_body(i: int) -> bytes:
    """Past the default body-memory-max: with the log on, the node keeps these in its log."""
    return f"sentinel-{i}-".encode().ljust(600, b"s")


def add_sentinels(port: int) -> list[bytes]:
    ids = [call(port, "ADDJOB", SENTINEL_QUEUE, sentinel_body(i), 0, "RETRY", 3600)
           for i in range(SENTINELS)]
    assert all(isinstance(i, bytes) for i in ids), ids
    return ids


def info_int(port: int, section: str, name: str) -> int:
    text = call(port, "INFO", section).decode()
    return int(text.split(name + ":")[1].split("\r\n")[0])


def commands_processed(port: int) -> int:
    return info_int(port, "stats", "total_commands_processed")


def add_run_options(ap: argparse.ArgumentParser, count: int) -> None:
    """The options every fuzzer here takes: how much, over how many connections, which seed."""
    ap.add_argument("--count", type=int, default=count)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=300.0)


def chosen_seed(args: argparse.Namespace) -> int:
    """``--seed``, else a random one; printed first, so that a failure replays."""
    seed: int = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"seed {seed}", flush=True)
    return seed


def check_whole(port: int, sentinels: list[bytes]) -> list[str]:
    """What is wrong with the node after the storm (empty: nothing)."""
    problems = []
    try:
        call(port, "PING")
    except OSError as exc:
        return [f"the node is unreachable: {exc}"]
    if call(port, "PING") != b"PONG":
        problems.append("no PONG on a fresh connection")
    shown = [call(port, "SHOW", i) for i in sentinels]
    missing = [i for i, s in zip(sentinels, shown, strict=True) if s is None]
    if missing:
        problems.append(f"{len(missing)} sentinel jobs lost, e.g. {missing[0]!r}")
    wrong = [i for k, (i, s) in enumerate(zip(sentinels, shown, strict=True))
             if s is not None and s[s.index(b"body") + 1] != sentinel_body(k)]
    if wrong:
        problems.append(f"{len(wrong)} sentinel jobs with a wrong body, e.g. {wrong[0]!r}")
    return problems


def process_use(pid: int) -> tuple[int, int]:
    """A process's resident memory (bytes) and open file descriptors."""
    with open(f"/proc/{pid}/status") as fh:
        rss = next((int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:")),
                   -1)
    if rss < 0:
        raise ProcessLookupError(f"process {pid} has exited")
    return rss, len(list(Path(f"/proc/{pid}/fd").iterdir()))


def settled_fds(pid: int, bound: int, seconds: float) -> int:
    """The process's open descriptors once at most ``bound`` (or after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while True:
        fds = process_use(pid)[1]
        if fds <= bound or time.monotonic() > deadline:
            return fds
        time.sleep(0.2)


def check_tls(port: int, context: ssl.SSLContext) -> list[str]:
    """PING over a fresh TLS connection."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw) as s:
            s.sendall(encode_command(b"PING"))
            reply = s.recv(100)
    except OSError as exc:
        return [f"no PING over a fresh TLS connection: {exc!r}"]
    return [] if reply == b"+PONG\r\n" else [f"PING over TLS answered {reply!r}"]


def _fuzz(port: int, tls_port: int | None, pid: int | None, args: argparse.Namespace,
          seed: int, contexts: list[ssl.SSLContext] | None,
          ) -> tuple[dict[str, int], list[str], list[bytes]]:
    """Sentinels, the storm (to ``tls_port`` with ``contexts``), the checks: what was done,
    what is wrong, the sentinels."""
    sentinels = add_sentinels(port)
    before = commands_processed(port)
    fds = process_use(pid)[1] if pid is not None else 0
    stats = storm(tls_port or port, args.count, args.connections, seed, args.seconds, True,
                  contexts)
    problems = check_whole(port, sentinels)
    if contexts and tls_port and not problems:
        problems += check_tls(tls_port, contexts[-1])
    if pid is not None and not problems:
        left = settled_fds(pid, fds, 15) - fds
        if left > 0:
            problems.append(f"{left} descriptors still open 15 s after every connection "
                            "closed")
    stats["executed"] = -1 if problems else commands_processed(port) - before
    return stats, problems, sentinels


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(ap, 200_000)
    ap.add_argument("--tls", action="store_true", help="fuzz the tls-port")
    ap.add_argument("--port", type=int, default=None, help="fuzz a running node instead")
    ap.add_argument("--tls-port", type=int, default=None, help="the running node's (--tls)")
    ap.add_argument("--ca", default=None, help="the running node's CA (--tls)")
    args = ap.parse_args(argv)
    seed = chosen_seed(args)
    if args.port is not None:
        contexts = None
        if args.tls:
            if args.tls_port is None or args.ca is None:
                ap.error("--tls with --port needs --tls-port and --ca")
            contexts = [fuzz_tls.trusting(args.ca)]
        stats, problems, _ = _fuzz(args.port, args.tls_port, None, args, seed, contexts)
    else:
        from tests.support.server import ServerProcess, free_port

        with tempfile.TemporaryDirectory(prefix="fuzz-resp-") as tmp:
            directives: dict[str, Any] = {"appendonly": "yes", "appendfsync": "always"}
            contexts = None
            if args.tls:
                certs = fuzz_tls.make_certs(Path(tmp))
                directives.update(tls_port=free_port(), **fuzz_tls.node_files(certs),
                                  tls_ca_cert_file=str(certs.ca_cert),
                                  tls_auth_clients="optional")
                contexts = fuzz_tls.client_contexts(certs)
            with ServerProcess(**directives) as srv:
                assert srv.proc is not None
                tls_port = int(srv.directives["tls-port"]) if args.tls else None
                stats, problems, sentinels = _fuzz(srv.port, tls_port, srv.proc.pid, args, seed,
                                                   contexts)
                # An exception the node caught while serving is a bug even if it stayed
                # whole.
                problems += srv.audit()
                if problems:
                    stats["executed"] = -1
                    print(srv.log()[-3000:], flush=True)
                else:
                    srv.kill()
                    srv.start()
                    problems += [f"after restart: {p}"
                                 for p in check_whole(srv.port, sentinels)]
    if args.tls:
        print(f"{stats['bad_handshakes']} handshakes of garbage, {stats['handshakes_failed']} "
              f"refused, {stats['damaged']} connections with damaged records", flush=True)
    print(f"{stats['inputs']} inputs, {stats['executed']} commands executed by the node, "
          f"{stats['connections']} connections, {stats['abrupt_closes']} closed abruptly",
          flush=True)
    for p in problems:
        print(f"PROBLEM: {p}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
