"""Throw fuzzed cluster bus frames at a real node, then check the cluster is still whole.

Usage: python -m tools.fuzz_bus [--count 1000000] [--seed N] [--seconds 3600]
                                [--ports P0,P1,P2[,P3]] [--secret-frames 20000]
                                [--tls [--refused 600]]

Three ``trisque-server`` nodes are started on loopback (on ``--ports``, else free ports) and
joined; a few jobs are replicated to all three. Then an attacker who knows node 0's ID (the
bus has no authentication without ``cluster-secret``) connects to node 1's bus port and sends
``--count`` frames claiming to come from node 0: real bodies of every message type, mutated
(``tools/bus_frames.py``). Node 1 must answer PING on its client port throughout (checked
every second), and within ``RECOVER_S`` of the end of the storm the cluster must replicate
again (ADDJOB REPLICATE 3 on nodes 1 and 0, each job then shown by the other nodes). No node
may log an unexpected error in its cluster core or count one in INFO, and within 30 s node 1
must have no more descriptors open than before the storm. Last, a node with a
``cluster-secret`` is sent ``--secret-frames`` frames without a MAC, with a wrong one, or
signed with another secret: it must drop each link cleanly and go on answering.

``--tls`` runs the nodes with ``tls-cluster yes`` instead (tools/fuzz_bus_tls.py): first
``--refused`` links that must never get a frame read (garbage, cut or doubled ClientHellos,
plaintext frames, no client certificate, another CA's), then the same storm over TLS with the
cluster's client certificate, some records damaged or sent a few bytes at a time; the same
checks afterwards (no node with a secret).

Every random choice comes from ``--seed``, printed first, so a failure replays. The last line
is ``<frames> frames ... <problems> problems``; the exit status is 1 if anything was wrong.
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.wire import HEADER
from tests.support.cluster import free_ports, parse_nodes
from tests.support.server import ServerProcess, free_port, send_command
from tools.bus_frames import Mutator, sample_bodies
from tools.fuzz_resp import chosen_seed, process_use, settled_fds

if TYPE_CHECKING:  # imported when --tls is given: it imports this module
    from tools.fuzz_bus_tls import TlsCluster

RECOVER_S = 30.0
NODE_TIMEOUT_MS = 2000
PING_EVERY_S = 1.0
PING_TIMEOUT_S = 10.0
BATCH_FRAMES = 64
BATCH_BYTES = 256 * 1024


def call(port: int, *args: Any, timeout: float = 10.0) -> Any:
    return send_command(port, *args, timeout=timeout)


def start_cluster(base: Path, ports: list[int], per_node: list[dict[str, Any]] | None = None,
                  **directives: Any) -> list[ServerProcess]:
    """Nodes on ``ports`` with ``directives``, and node i with ``per_node[i]`` too."""
    nodes = []
    for i, port in enumerate(ports):
        directory = base / f"node{i}"
        directory.mkdir(parents=True)
        own = per_node[i] if per_node else {}
        nodes.append(ServerProcess(port=port, directory=str(directory),
                                   cluster_node_timeout=NODE_TIMEOUT_MS, **directives, **own))
    for node in nodes:
        node.start(wait=False)
    for node in nodes:
        node.wait_ready()
    return nodes


def meshed(nodes: list[ServerProcess]) -> bool:
    for node in nodes:
        table = parse_nodes(call(node.port, "CLUSTER", "NODES"))
        if len(table) != len(nodes) or any(
                line.link != "connected" or not line.flags & {"myself", "noflags"}
                for line in table.values()):
            return False
    return True


def wait(pred: Any, seconds: float) -> float | None:
    """Seconds until ``pred()`` was true, or None if it never was within ``seconds``."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            if pred():
                return time.monotonic() - start
        except (OSError, ConnectionError):
            pass
        time.sleep(0.1)
    return None


def messages_received(port: int) -> int:
    """CLUSTER INFO's cluster_stats_messages_received: the frames the node's cores took."""
    text = call(port, "CLUSTER", "INFO").decode()
    return int(text.split("cluster_stats_messages_received:")[1].split("\r\n")[0])


def unexpected_errors(port: int) -> int:
    """INFO's cluster_unexpected_errors: exceptions the node's bus caught from a core."""
    text = call(port, "INFO", "stats").decode()
    return int(text.split("cluster_unexpected_errors:")[1].split("\r\n")[0])


def replicates(nodes: list[ServerProcess], origin: int, tag: str) -> bool:
    """ADDJOB REPLICATE <all> on ``origin``; True if it was answered with an ID that every
    other node then shows."""
    job = call(nodes[origin].port, "ADDJOB", f"fuzz-check-{tag}", "x", 2000,
               "REPLICATE", len(nodes), "RETRY", 3600)
    if not isinstance(job, bytes) or not job.startswith(b"D-"):
        return False
    return all(wait(lambda n=n: call(n.port, "SHOW", job) is not None, 5.0) is not None
               for n in nodes)


class Attacker:
    """One inbound bus link at a time to ``port``; reconnects whenever the node closes it, or
    after a frame that makes the node close it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.links = 0
        self.closed_by_node = 0  # links the node closed after a frame expected to pass

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.setblocking(False)
        self.links += 1
        return sock

    def send(self, data: bytes, last_on_link: bool) -> None:
        if self.sock is None:
            self.sock = self._connect()
        self._deliver(data, last_on_link)

    def _deliver(self, data: bytes, last_on_link: bool, ends: bool = True) -> bool:
        """Send ``data`` on the open link and read the answers; False once the link is closed
        (by the node, or here after the link's last frame when ``ends``)."""
        assert self.sock is not None
        try:
            self.sock.setblocking(True)
            self.sock.settimeout(30)
            self.sock.sendall(data)
            self.sock.setblocking(False)
            if self._drain():
                self.closed_by_node += not last_on_link
                self._close()
                return False
        except OSError:
            self.closed_by_node += not last_on_link
            self._close()
            return False
        if last_on_link and ends:
            self._finish()
            return False
        return True

    def _drain(self) -> bool:
        """Read the node's answers (PONGs); True if it closed the link."""
        assert self.sock is not None
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return False
            except OSError:
                return True
            if not data:
                return True

    def _finish(self) -> None:
        """End the link after a frame the node refuses: wait (briefly) for it to close,
        so the frame is read before our end goes away."""
        assert self.sock is not None
        try:
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.setblocking(True)
            self.sock.settimeout(5)
            while self.sock.recv(1 << 16):
                pass
        except OSError:
            pass
        self._close()

    def _close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def storm(nodes: list[ServerProcess], count: int, seed: int, seconds: float,
          verbose: bool, attacker: Attacker | None = None) -> dict[str, Any]:
    """``count`` fuzzed frames as node 0 to node 1's bus port (by ``attacker``, else over
    plaintext), node 1 PINGed every second meanwhile: what was done."""
    ids = [call(n.port, "CLUSTER", "MYID").decode() for n in nodes]
    ports = [n.port for n in nodes]
    job_ids = [call(ports[0], "ADDJOB", "fuzzq", f"seed-{i}", 2000, "REPLICATE", len(nodes),
                    "RETRY", 3600) for i in range(4)]
    mutator = Mutator(random.Random(seed), ids, ports,
                      sample_bodies(ids, ports, [j for j in job_ids if isinstance(j, bytes)]))
    attacker = attacker or Attacker(ports[1] + 10000)
    received_before = messages_received(ports[1])
    stats: dict[str, Any] = {"frames": 0, "bytes": 0, "max_ping_s": 0.0, "pings": 0,
                             "unanswered": 0}
    start = time.monotonic()
    next_ping = start
    batch: list[bytes] = []
    size = 0
    while stats["frames"] < count and time.monotonic() - start < seconds:
        fuzzed = mutator.frame(ids[0])
        batch.append(fuzzed.data)
        size += len(fuzzed.data)
        stats["frames"] += 1
        stats["bytes"] += len(fuzzed.data)
        if fuzzed.closes_link or len(batch) >= BATCH_FRAMES or size >= BATCH_BYTES:
            attacker.send(b"".join(batch), fuzzed.closes_link)
            batch, size = [], 0
        now = time.monotonic()
        if now >= next_ping:
            next_ping = now + PING_EVERY_S
            t0 = time.monotonic()
            try:
                ok = call(ports[1], "PING", timeout=PING_TIMEOUT_S) == b"PONG"
            except OSError:
                ok = False
            stats["pings"] += 1
            stats["unanswered"] += not ok
            stats["max_ping_s"] = max(stats["max_ping_s"], time.monotonic() - t0)
            if verbose and stats["pings"] % 30 == 0:
                print(f"  {stats['frames']} frames, {attacker.links} links, "
                      f"{time.monotonic() - start:.0f} s", flush=True)
    if batch:
        attacker.send(b"".join(batch), True)
    attacker._close()
    stats["seconds"] = time.monotonic() - start
    stats["received"] = messages_received(ports[1]) - received_before
    stats["links"] = attacker.links
    stats["closed_by_node"] = attacker.closed_by_node
    return stats


def secret_storm(base: Path, port: int, count: int, seed: int) -> list[str]:
    """Frames without a MAC, with a wrong one, or signed with another secret, to a node
    with a ``cluster-secret``: every link dropped, the node still answers."""
    rng = random.Random(seed)
    with ServerProcess(port=port, directory=str(base), cluster_secret="s3cret") as node:
        node_id = call(port, "CLUSTER", "MYID").decode()
        ids = [f"{rng.getrandbits(160):040x}", node_id, f"{rng.getrandbits(160):040x}"]
        mutator = Mutator(rng, ids, [port, port, port], sample_bodies(ids, [port] * 3))
        attacker = Attacker(port + 10000)
        from cluster.wire import FLAG_MAC, encode_message
        for i in range(count):
            data = mutator.frame(ids[0]).data
            kind = i % 3
            if kind == 1 and len(data) >= HEADER.size:  # flagged, with a junk MAC
                data = data[:5] + bytes([data[5] | FLAG_MAC]) + data[6:] + rng.randbytes(32)
            elif kind == 2:  # signed with another secret
                data = encode_message(mutator.pick_sample()[0], ids[0],
                                      mutator.pick_sample()[1], b"not-the-secret")
            attacker.send(data, True)
        problems = [] if call(port, "PING") == b"PONG" else ["the secret node stopped answering"]
        problems += node.audit()
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=3600.0)
    ap.add_argument("--ports", default="", help="three client ports (bus = port + 10000), "
                    "and a fourth for the secret node (with --tls: node 1's HTTP port)")
    ap.add_argument("--secret-frames", type=int, default=20_000)
    ap.add_argument("--tls", action="store_true", help="tls-cluster yes (tools/fuzz_bus_tls.py)")
    ap.add_argument("--refused", type=int, default=600,
                    help="with --tls: links without a valid handshake or certificate")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    seed = chosen_seed(args)
    ports = [int(p) for p in args.ports.split(",")] if args.ports else \
        free_ports(4)
    spare = ports[3] if len(ports) > 3 else free_port()
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="trisque-fuzz-bus-") as tmp:
        tls: TlsCluster | None = None
        if args.tls:
            from tools import fuzz_bus_tls

            tls = fuzz_bus_tls.TlsCluster(Path(tmp), spare)
        nodes = start_cluster(Path(tmp), ports[:3], tls.directives() if tls else None)
        try:
            for i in (1, 2):
                call(ports[0], "CLUSTER", "MEET", "127.0.0.1", ports[i])
            if wait(lambda: meshed(nodes), 30) is None:
                raise SystemExit("the cluster did not form")
            assert nodes[1].proc is not None
            pid = nodes[1].proc.pid
            fds = process_use(pid)[1]
            attacker = None
            if tls is not None:
                problems += tls.refuse(nodes, args.refused, seed)
                attacker = tls.attacker(ports[1] + 10000, seed)
            stats = storm(nodes, args.count, seed, args.seconds, not args.quiet, attacker)
            if stats["unanswered"]:
                problems.append(f"node 1 left {stats['unanswered']} PINGs unanswered")
            if nodes[1].proc is None or nodes[1].proc.poll() is not None:
                problems.append("node 1 exited")
            recovered = wait(lambda: replicates(nodes, 1, "a") and replicates(nodes, 0, "b"),
                             RECOVER_S)
            if recovered is None:
                problems.append(f"the cluster does not replicate {RECOVER_S:.0f} s after")
            stats["recovered_s"] = recovered
            left = settled_fds(pid, fds, 30) - fds
            if left > 0:
                problems.append(f"node 1 has {left} more descriptors open 30 s after the "
                                f"storm than before it ({fds})")
            stats["unexpected"] = sum(unexpected_errors(n.port) for n in nodes)
            for node in nodes:
                problems += node.audit()
        finally:
            for node in nodes:
                node.stop()
        if args.secret_frames and tls is None:
            secret_dir = Path(tmp) / "secret"
            secret_dir.mkdir()
            problems += secret_storm(secret_dir, spare, args.secret_frames, seed)
    if tls is not None:
        print(tls.report(), flush=True)
    recovered_text = f"{stats['recovered_s']:.1f}" if stats["recovered_s"] is not None else "-"
    secret = "" if tls else f", {args.secret_frames} frames to a node with a secret"
    print(f"{stats['frames']} frames ({stats['bytes'] / 1e6:.0f} MB) in "
          f"{stats['seconds']:.0f} s over {stats['links']} links "
          f"({stats['closed_by_node']} closed early; node 1 counted {stats['received']} "
          f"messages received), {stats['pings']} PINGs answered in at "
          f"most {stats['max_ping_s']:.2f} s, replicating again after "
          f"{recovered_text} s, "
          f"{stats['unexpected']} unexpected errors counted by the nodes{secret}; "
          f"{len(problems)} problems",
          flush=True)
    for p in problems:
        print(f"PROBLEM: {p}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
