"""One socket from `trisque` to one node, and the one-line messages a broken one gives.

Every reply is read with ``client.typed_reply.TypedReplyParser`` so status, bulk and error
replies stay apart for the formatters (``cli.reply_format``). The protocol modules are imported
when the first command is sent, not with this module: ``--pipe`` only opens the socket, and
Python's start-up is most of what a ``--pipe`` run costs beyond redis-cli's. For the same
reason the socket is the C type of ``_socket``, the module under ``socket``: what the client
uses of a socket is all there, and ``socket``'s enums, selectors and wrappers (with ``enum``,
``functools`` and ``collections`` under them) are a few ms of start-up it does not need.
"""

from __future__ import annotations

import _socket
import sys

# The typing module is for type checkers only here (annotations are not evaluated): importing
# it costs start-up too.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from client.tls import TlsOptions

CONNECT_TIMEOUT = 5.0


class NodeGone(Exception):
    """The connection broke; ``str()`` is the one-line message for the user."""


def reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class NodeConnection:
    """One socket to the node, opened lazily and reopened after a break (prompt mode)."""

    def __init__(self, host: str, port: int, password: str | None,
                 user: str | None = None, tls: TlsOptions | None = None) -> None:
        self.host, self.port, self.password, self.user = host, port, password, user
        self.tls = tls  # --tls: the socket is an ssl.SSLSocket
        self.sock: Any = None  # a _socket.socket, or an ssl.SSLSocket with --tls
        self.parser: Any = None  # a TypedReplyParser once connected

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"

    def connect(self) -> None:
        """Open the socket and authenticate; raises ``NodeGone`` with the redis-cli style
        message."""
        self.open_socket()
        from client.typed_reply import TypedReplyParser
        from protocol.resp import Error

        self.parser = TypedReplyParser()
        if self.password is not None:
            auth = [b"AUTH"] + ([self.user.encode()] if self.user else []) + [self.password.encode()]
            reply = self.call(auth)
            if isinstance(reply, Error):
                sys.stderr.write(f"AUTH failed: {reply}\n")

    def open_socket(self) -> None:
        try:
            # An ASCII name goes as bytes: a str is IDNA-encoded first, which imports the
            # IDNA codec (a few ms of start-up). getaddrinfo takes bytes, and so does
            # create_connection, which passes the host on; only its stub says str.
            host = self.host.encode() if self.host.isascii() else self.host
            self.sock = connect_to(host, self.port, CONNECT_TIMEOUT)
            if self.tls is not None:
                self.sock = self._handshake(self.sock)
        except (OSError, ValueError) as exc:
            raise NodeGone(f"Could not connect to trisque at {self.name}: {reason(exc)}") from None
        # Replies to blocking commands (GETJOB) may take as long as the user asked for.
        self.sock.settimeout(None)
        self.sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)

    def _handshake(self, sock: _socket.socket) -> Any:
        """TLS over the connected socket (the ``ssl`` module is imported only for --tls)."""
        import socket
        import ssl

        assert self.tls is not None
        context = self.tls.context()
        plain = socket.socket(sock.family, sock.type, sock.proto, fileno=sock.detach())
        plain.settimeout(CONNECT_TIMEOUT)
        try:
            return context.wrap_socket(plain, server_hostname=self.tls.sni or self.host)
        except (OSError, ssl.CertificateError):
            plain.close()
            raise

    def call(self, args: list[bytes], timeout: float | None = None) -> Any:
        """Send one command and read its reply. With ``timeout``, a reply that takes longer
        closes the connection (its late reply must not answer the next command)."""
        from protocol.resp import NEED_DATA, ProtocolError, encode_command

        if self.sock is None:
            self.connect()
        assert self.sock is not None
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(encode_command(*args))
            while True:
                reply = self.parser.next()
                if reply is not NEED_DATA:
                    return reply
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionResetError("Server closed the connection")
                self.parser.feed(data)
        except (OSError, ProtocolError) as exc:
            self.close()
            raise NodeGone(f"Error: connection to trisque at {self.name} lost: "
                           f"{reason(exc)}") from None
        finally:
            if self.sock is not None:
                self.sock.settimeout(None)

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None


def connect_to(host: str | bytes, port: int, timeout: float) -> _socket.socket:
    """A socket connected to the first address of ``host`` that answers, as
    ``socket.create_connection`` does it; the last address's error if none does."""
    failure: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(host, port, 0,
                                                               _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            failure = exc
        else:
            return sock
    raise failure or OSError(f"no address found for {host!r}")
