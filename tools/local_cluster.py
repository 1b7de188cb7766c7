"""``make cluster``: three local trisque nodes joined into one cluster, in the foreground.

Starts one ``trisque-server`` per port (7711-7713 by default) with ``conf/trisque.conf``, its
data, log (``trisque.log``) and pid file (``trisque.pid``) in ``./data/cluster/<port>/``; joins
them with CLUSTER MEET from the first node to the others (nodes that already know each other
from their ``nodes.conf`` are not met again); waits until every node sees every other one;
prints CLUSTER NODES; then waits. Ctrl-C (or SIGTERM) stops the three nodes with SIGTERM (a
clean stop: each writes its snapshot) and returns once they have exited.

The nodes run in their own process group, so a Ctrl-C in the terminal reaches this script
only and the nodes get exactly one signal each. A node that dies meanwhile (say, kill -9 for
a demonstration) is reported with the command that starts it again by hand; this script does
not restart it and stops only the processes it started.

``--tls``: the bus runs with ``tls-cluster yes``, each node with its certificate from
``<dir>/certs/`` (made by ``cli.certs`` the first time: a CA, one certificate per port and a
client certificate), and each node serves TLS clients on its port + 100 as well.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from cli.certs import generate
from tests.support.server import send_command

REPO = Path(__file__).resolve().parents[1]


def server_argv(config: str, port: int, directory: Path, node_timeout: int) -> list[str]:
    # Shown to the user as the way to start a node again: relative when inside this folder.
    python = os.path.relpath(sys.executable)
    python = sys.executable if python.startswith("..") else python
    return [python, "-m", "cli.server", config, "--port", str(port), "--dir", str(directory),
            "--logfile", str(directory / "trisque.log"),
            "--pidfile", str(directory / "trisque.pid"),
            "--cluster-node-timeout", str(node_timeout)]


#: With --tls, each node also serves TLS clients on its port + this (7811-7813 by default).
TLS_PORT_OFFSET = 100


def tls_argv(certs: Path, index: int, port: int) -> list[str]:
    """``tls-cluster yes`` with node ``index``'s certificate (1-based, as ``cli.certs`` names
    them), and a TLS client port beside the plain one (which the join uses)."""
    cert, key = certs / f"node-{index}.crt", certs / f"node-{index}.key"
    if not cert.exists():
        raise SystemExit(f"{cert} is missing: remove {certs} to make a new set")
    return ["--tls-cluster", "yes", "--tls-port", str(port + TLS_PORT_OFFSET), "--tls-cert-file", str(cert.resolve()), "--tls-key-file",
            str(key.resolve()), "--tls-ca-cert-file", str((certs / "ca.crt").resolve())]


def wait_ready(port: int, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"node {port} exited with code {proc.returncode} while starting")
        try:
            if send_command(port, "PING", timeout=1.0) == b"PONG":
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"node {port} does not answer PING")
        time.sleep(0.05)


def cluster_nodes(port: int) -> list[list[str]]:
    reply = send_command(port, "CLUSTER", "NODES", timeout=2.0)
    if not isinstance(reply, bytes):
        raise SystemExit(f"CLUSTER NODES on {port}: {reply!r}")
    return [line.split() for line in reply.decode().splitlines()]


def joined(ports: list[int]) -> bool:
    """Every node lists every port, connected, with no handshake, pfail or fail flag."""
    for port in ports:
        lines = cluster_nodes(port)
        seen = {fields[1].rsplit(":", 1)[1] for fields in lines}
        flags = {flag for fields in lines for flag in fields[2].split(",")}
        links = {fields[5] for fields in lines}
        if (seen != {str(p) for p in ports} or links != {"connected"}
                or flags & {"handshake", "pfail", "fail", "noaddr"}):
            return False
    return True


def join(ports: list[int], timeout: float) -> None:
    known = {fields[1].rsplit(":", 1)[1] for fields in cluster_nodes(ports[0])}
    for port in ports[1:]:
        if str(port) in known:
            continue  # already met in an earlier run: nodes.conf remembers it
        reply = send_command(ports[0], "CLUSTER", "MEET", "127.0.0.1", port)
        if reply != b"OK":
            raise SystemExit(f"CLUSTER MEET 127.0.0.1 {port} on {ports[0]}: {reply!r}")
    deadline = time.monotonic() + timeout
    while not joined(ports):
        if time.monotonic() > deadline:
            raise SystemExit(f"the nodes did not join within {timeout:.0f} s; see their trisque.log")
        time.sleep(0.1)


def stop(procs: dict[int, subprocess.Popen[bytes]], timeout: float = 15.0) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for port, proc in procs.items():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"node {port} did not stop within {timeout:.0f} s: killed", flush=True)
            proc.kill()
            proc.wait()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--ports", type=int, nargs="+", default=[7711, 7712, 7713])
    parser.add_argument("--dir", default="./data/cluster", help="one folder per port under it")
    parser.add_argument("--config", default=os.path.relpath(REPO / "conf" / "trisque.conf"))
    parser.add_argument("--node-timeout", type=int, default=5000,
                        help="cluster-node-timeout in ms (default 5000)")
    parser.add_argument("--join-timeout", type=float, default=30.0)
    parser.add_argument("--tls", action="store_true",
                        help="mutual TLS on the bus, TLS clients on port + 100, certificates in "
                             "<dir>/certs")
    args = parser.parse_args(argv)

    # Both stop the nodes, even when started from a shell that ignores SIGINT in background jobs.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    # The nodes run this checkout's code even when the venv's package is installed from
    # another one (python -m looks in the current directory, which need not be this one).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    procs: dict[int, subprocess.Popen[bytes]] = {}
    commands: dict[int, list[str]] = {}
    certs = Path(args.dir) / "certs"
    try:
        if args.tls and not (certs / "ca.crt").exists():
            generate(certs, nodes=len(args.ports))
        for index, port in enumerate(args.ports, 1):
            directory = Path(args.dir) / str(port)
            directory.mkdir(parents=True, exist_ok=True)
            commands[port] = server_argv(args.config, port, directory, args.node_timeout)
            if args.tls:
                commands[port] += tls_argv(certs, index, port)
            procs[port] = subprocess.Popen(commands[port], start_new_session=True, env=env)
        deadline = time.monotonic() + 30.0
        for port, proc in procs.items():
            wait_ready(port, proc, deadline)
        join(args.ports, args.join_timeout)
        sys.stdout.write(send_command(args.ports[0], "CLUSTER", "NODES").decode())
        print(f"{len(procs)} nodes joined; logs in {args.dir}/<port>/trisque.log. "
              "Ctrl-C stops them.", flush=True)
        reported: set[int] = set()
        while True:
            for port, proc in procs.items():
                if port not in reported and proc.poll() is not None:
                    reported.add(port)
                    print(f"node {port} exited with code {proc.returncode}; start it again "
                          f"with: {shlex.join(commands[port])}", flush=True)
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("stopping the nodes...", flush=True)
        return 0
    except SystemExit as exc:
        print(f"make cluster: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        stop(procs)
        if procs:
            print("all nodes stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
