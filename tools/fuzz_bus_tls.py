"""``python -m tools.fuzz_bus --tls``: the cluster bus under ``tls-cluster yes``, attacked
below the frames too.

The three nodes get certificates from one CA (``cli.certs``, by tools/fuzz_tls.py), node 1 an
HTTP port for its /metrics. First ``refuse`` opens ``--refused`` links to node 1's bus port
that must never get a frame read, in turn: random bytes, a ClientHello cut anywhere, two
ClientHellos, plaintext bus frames, and handshakes without a client certificate or with one
from another CA, followed (where TLS 1.3 lets the client finish first) by sealed frames. Each
link must be counted refused (``trisque_bus_links_refused_tls_total``), those the node can
refuse at once must be closed by it, and none of their frames may be counted received: they
carry only message types an idle cluster never exchanges (not ``ROUTINE``), frames of a member
(node 0), and the node's counters of those types (``trisque_bus_messages_received_total``)
must not move.

Then tools/fuzz_bus.py's storm goes through ``TlsAttacker``: links with the cluster's client
certificate (TLS 1.2 or 1.3), the mutated frames sealed in good records; ``DAMAGED`` of the
batches have their records damaged (tools/fuzz_tls.py's ``damage``: cut, a flipped bit,
plaintext, a second ClientHello, a length that lies, a record of another type) and end their
link; ``SLOW`` of them are sent cut at random bytes, a millisecond apart.
"""

from __future__ import annotations

import random
import select
import socket
import ssl
import time
import urllib.request
from pathlib import Path
from typing import Any, Final

from cluster.wire import MessageType
from tests.support.server import ServerProcess, send_command
from tools import fuzz_tls
from tools.bus_frames import Mutator, sample_bodies
from tools.fuzz_bus import Attacker

# The types an idle cluster sends all the time (failure detection, the tables' anti-entropy):
# the received counters of every other type stay still while the refused links are tried.
ROUTINE: Final = frozenset({MessageType.PING, MessageType.PONG, MessageType.QPOLICY,
                            MessageType.TIMER, MessageType.USERS, MessageType.DEDUP})
KINDS: Final = ("garbage", "cut hello", "two hellos", "plaintext frames", "no certificate",
                "another CA")
# What the node can refuse as soon as it arrives, so it must close the link itself (a cut
# ClientHello waits for its rest, and random bytes may begin a long record).
CLOSED_AT_ONCE: Final = frozenset(KINDS[2:])
REFUSED_FRAME_MAX = 64 * 1024
REFUSED_TLS = "trisque_bus_links_refused_tls_total"
DAMAGED = 0.1
SLOW = 0.02


def metrics(http_port: int) -> dict[str, float]:
    """Node's /metrics samples, by name with labels."""
    url = f"http://127.0.0.1:{http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def received(sample: dict[str, float], mtype: MessageType) -> float:
    return sample.get(f'trisque_bus_messages_received_total{{type="{mtype.name}"}}', 0.0)


class TlsCluster:
    """The certificates of a fuzzed TLS cluster, and what is done with them."""

    def __init__(self, base: Path, http_port: int) -> None:
        self.certs = fuzz_tls.make_certs(base / "certs", nodes=3)
        self.foreign = fuzz_tls.make_certs(base / "foreign", nodes=1, organization="intruder")
        self.http_port = http_port
        self.refused: dict[str, Any] = {}  # what ``refuse`` did
        self.storm: TlsAttacker | None = None

    def directives(self) -> list[dict[str, Any]]:
        """Each node's ``tls-cluster`` directives; node 1's HTTP port."""
        out: list[dict[str, Any]] = [
            {"tls_cluster": "yes", "tls_cert_file": str(cert), "tls_key_file": str(key),
             "tls_ca_cert_file": str(self.certs.ca_cert)} for cert, key in self.certs.nodes]
        out[1]["http_port"] = self.http_port
        return out

    def contexts(self, cert: tuple[Path, Path] | None) -> list[ssl.SSLContext]:
        """TLSv1.2 and TLSv1.3 client contexts that trust the cluster's CA and present
        ``cert``."""
        return [fuzz_tls.client_context(self.certs.ca_cert, v, cert) for v in fuzz_tls.VERSIONS]

    def attacker(self, bus_port: int, seed: int) -> TlsAttacker:
        """The storm's attacker, with the cluster's client certificate."""
        self.storm = TlsAttacker(bus_port, self.contexts(self.certs.client),
                                 random.Random(seed + 2))
        return self.storm

    def report(self) -> str:
        """A line on what was done at the TLS layer."""
        r = self.refused
        kinds = ", ".join(f"{r.get(k, 0)} {k}" for k in KINDS)
        line = (f"{r.get('refused', 0)} links refused by TLS ({kinds}; {r.get('frames', 0)} "
                f"frames sent on them, {r.get('counted', 0)} counted received, "
                f"{r.get('left_open', 0)} left open)")
        if self.storm is not None:
            line += (f"; with the client certificate {self.storm.damaged} links ended by "
                     f"damaged records, {self.storm.slow} batches sent slowly, "
                     f"{self.storm.handshakes_failed} handshakes failed")
        return line

    def refuse(self, nodes: list[ServerProcess], count: int, seed: int) -> list[str]:
        """``count`` links to node 1's bus port that must all be refused (module docstring):
        what is wrong (what was sent: ``self.refused``)."""
        rng = random.Random(seed + 1)
        ids = [send_command(n.port, "CLUSTER", "MYID").decode() for n in nodes]
        ports = [n.port for n in nodes]
        mutator = Mutator(rng, ids, ports, sample_bodies(ids, ports))
        contexts = {"no certificate": self.contexts(None),
                    "another CA": self.contexts(self.foreign.client)}
        valid = self.contexts(self.certs.client)
        before = metrics(self.http_port)
        stats = self.refused = dict.fromkeys(KINDS, 0)
        stats.update(frames=0, left_open=0)
        problems: list[str] = []
        for i in range(count):
            kind = KINDS[i % len(KINDS)]
            n = rng.randint(1, 20)
            frames = quiet_frames(mutator, ids[0], n)
            with socket.create_connection(("127.0.0.1", ports[1] + 10000), timeout=5) as sock:
                if kind == "garbage":
                    data = rng.randbytes(rng.randint(1, 4096))
                elif kind == "cut hello":
                    hello = fuzz_tls.client_hello(rng.choice(valid))
                    data = hello[:rng.randrange(1, len(hello))]
                elif kind == "two hellos":
                    data = b"".join(fuzz_tls.client_hello(rng.choice(valid)) for _ in range(2))
                elif kind == "plaintext frames":
                    data = frames
                    stats["frames"] += n
                else:  # TLS 1.3 finishes on the client's side before the node checks it
                    sock.setblocking(False)
                    tls = fuzz_tls.TlsClient(sock, rng.choice(contexts[kind]))
                    data = tls.seal(frames) if tls.handshake() else b""
                    stats["frames"] += n if data else 0
                stats[kind] += 1
                _send(sock, data)
                if kind in CLOSED_AT_ONCE and not _closed(sock, 5.0):
                    stats["left_open"] += 1
        if stats["left_open"]:
            problems.append(f"{stats['left_open']} links that failed TLS were left open 5 s")
        deadline = time.monotonic() + 15
        while True:
            after = metrics(self.http_port)
            refused = after.get(REFUSED_TLS, 0) - before.get(REFUSED_TLS, 0)
            if refused >= count or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        stats["refused"] = int(refused)
        if refused != count:
            problems.append(f"{refused:.0f} of {count} links without a valid handshake or "
                            "certificate counted refused")
        moved = {t.name: received(after, t) - received(before, t) for t in MessageType
                 if t not in ROUTINE and received(after, t) != received(before, t)}
        stats["counted"] = int(sum(moved.values()))
        if moved:
            problems.append(f"frames of refused links counted received: {moved}")
        return problems


def quiet_frames(mutator: Mutator, sender: str, n: int) -> bytes:
    """``n`` fuzzed frames from ``sender`` of types outside ``ROUTINE`` (by their header)."""
    routine = {int(t) for t in ROUTINE}
    out: list[bytes] = []
    while len(out) < n:
        data = mutator.frame(sender).data
        if len(data) <= REFUSED_FRAME_MAX and int.from_bytes(data[6:8], "big") not in routine:
            out.append(data)
    return b"".join(out)


def _send(sock: socket.socket, data: bytes) -> None:
    """Send what the node takes of ``data`` (it may close the link half-way)."""
    sock.setblocking(True)
    sock.settimeout(5)
    try:
        sock.sendall(data)
    except OSError:
        pass


def _closed(sock: socket.socket, seconds: float) -> bool:
    """Whether the node closes ``sock`` (EOF or reset) within ``seconds``."""
    deadline = time.monotonic() + seconds
    sock.setblocking(False)
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            return False
        try:
            if not sock.recv(1 << 16):
                return True
        except BlockingIOError:
            continue
        except OSError:
            return True
    return False


class TlsAttacker(Attacker):
    """``Attacker`` over TLS with the cluster's client certificate (module docstring)."""

    def __init__(self, port: int, contexts: list[ssl.SSLContext], rng: random.Random) -> None:
        super().__init__(port)
        self.contexts = contexts
        self.rng = rng
        self.tls: fuzz_tls.TlsClient | None = None
        self.hello = fuzz_tls.client_hello(contexts[0])
        self.damaged = 0  # links ended by damaged records
        self.slow = 0  # batches sent a few bytes at a time
        self.handshakes_failed = 0

    def send(self, data: bytes, last_on_link: bool) -> None:
        rng = self.rng
        if self.sock is None:
            sock = self._connect()
            tls = fuzz_tls.TlsClient(sock, rng.choice(self.contexts))
            if not tls.handshake():
                sock.close()
                self.handshakes_failed += 1
                return
            self.sock, self.tls = sock, tls
        assert self.tls is not None
        records = self.tls.seal(data)
        if rng.random() < DAMAGED:
            records, _ = fuzz_tls.damage(rng, records, self.hello, data)
            self.damaged += 1
            last_on_link = True  # the node drops the link there: what follows would be lost
        elif last_on_link and rng.random() < 0.5:
            records += self.tls.close_notify()
        if rng.random() >= SLOW:
            self._deliver(records, last_on_link)
            return
        self.slow += 1
        at = 0
        for _ in range(40):  # at most 40 pieces: the rest goes at once
            step = rng.choice((1, 2, 5, 13, 100, 1000))
            if at + step >= len(records):
                break
            if not self._deliver(records[at:at + step], last_on_link, ends=False):
                return
            at += step
            time.sleep(0.001)
        self._deliver(records[at:], last_on_link)

    def _close(self) -> None:
        super()._close()
        self.tls = None
