"""An in-process stand-in for a node, for tests that need replies a real node cannot be made
to give on demand (a HELLO naming other nodes, a status reply nested in an array, a
connection cut in the middle of a reply). Each connection is served by a thread; ``handler``
maps one command (a list of bytes) to a reply value for ``protocol.resp.encode``, or to
``CLOSE`` to drop the connection without answering.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from protocol.resp import NEED_DATA, RequestParser, encode

CLOSE = object()


class FakeNode:
    def __init__(self, handler: Callable[[list[bytes]], Any]) -> None:
        self.handler = handler
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.commands: list[list[bytes]] = []
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> FakeNode:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        parser = RequestParser()
        conn.settimeout(0.2)
        with conn:
            while not self._stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                parser.feed(data)
                out = []
                while (argv := parser.next()) is not NEED_DATA:
                    self.commands.append(argv)
                    reply = self.handler(argv)
                    if reply is CLOSE:
                        conn.sendall(b"".join(out))
                        return
                    out.append(encode(reply))
                conn.sendall(b"".join(out))
