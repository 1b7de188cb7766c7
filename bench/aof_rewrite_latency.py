"""What a rewrite costs the clients (a program, not a test):
``python -m bench.aof_rewrite_latency [--jobs 300000] [--clients 16]``.

Starts a real trisque-server with ``appendfsync always``, loads it with --jobs jobs, then runs
--clients connections doing ADDJOB one at a time (each waits for its reply, so each latency
includes the group-commit fsync) for a few seconds twice: once without and once with a
BGREWRITEAOF started after the first second. Prints p50/p99/p99.9/max of the ADDJOBs sent
while the rewrite ran next to the same figures without one, in the same run.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time

from tests.support.server import ServerProcess


def _command(sock: socket.socket, *args: bytes) -> bytes:
    sock.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
    reply = b""
    while not reply.endswith(b"\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        reply += chunk
    return reply


def _load(port: int, jobs: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        frame = b"*4\r\n$6\r\nADDJOB\r\n$7\r\npreload\r\n$40\r\n" + b"p" * 40 + b"\r\n$1\r\n0\r\n"
        for start in range(0, jobs, 1000):
            n = min(1000, jobs - start)
            sock.sendall(frame * n)
            got = 0
            buf = b""
            while got < n:
                buf += sock.recv(1 << 20)
                got = buf.count(b"\r\n")


def _run(port: int, clients: int, seconds: float, rewrite: bool) -> list[float]:
    stop = time.monotonic() + seconds
    samples: list[tuple[float, float]] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        mine = []
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            while time.monotonic() < stop:
                t = time.monotonic()
                _command(sock, b"ADDJOB", b"lat%d" % k, b"x" * 40, b"0")
                mine.append((t, time.monotonic() - t))
        with lock:
            samples.extend(mine)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    start = time.monotonic()
    end = stop
    if rewrite:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            _command(sock, b"BGREWRITEAOF")
            while b"aof_rewrite_in_progress:1" in _command(sock, b"INFO", b"persistence"):
                time.sleep(0.02)
            end = time.monotonic()
    for t in threads:
        t.join()
    return sorted(lat for t, lat in samples if start <= t <= end)


def _figures(lat: list[float]) -> str:
    def q(p: float) -> float:
        return lat[int(p * (len(lat) - 1))] * 1000

    return (f"n={len(lat):>6}  p50={q(.5):6.2f} ms  p99={q(.99):6.2f} ms  "
            f"p99.9={q(.999):6.2f} ms  max={lat[-1] * 1000:6.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=300_000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args()
    with ServerProcess(appendonly="yes", appendfsync="always",
                       auto_aof_rewrite_percentage=0) as node:
        _load(node.port, args.jobs)
        base = _run(node.port, args.clients, args.seconds, rewrite=False)
        during = _run(node.port, args.clients, args.seconds, rewrite=True)
        size = [line for line in node.call("INFO", "persistence").decode().splitlines()
                if line.startswith("aof_current_size")]
    print(f"{args.clients} clients, ADDJOB with appendfsync always, {args.jobs} jobs loaded ({size[0]})")
    print(f"  no rewrite       {_figures(base)}")
    print(f"  during rewrite   {_figures(during)}")


if __name__ == "__main__":
    main()
