"""TLS on the client port: the context the ``tls-*`` directives describe, and a connection's
TLS layer over its non-blocking socket.

Theory of operation
-------------------
A TLS connection is an ordinary ``Connection`` whose ``sock`` is a ``TlsStream``
(``node/tls_stream.py``, compiled with the core: it runs for every request): an
``ssl.SSLObject`` between two ``MemoryBIO``s over the accepted socket, with the socket's
``recv``/``send``/``fileno``/``close``. The reactor does not know the difference, so the
handshake, reads and writes advance in its turns with no task per connection:

* ``recv`` reads the socket once, feeds the bytes to the TLS object, takes the handshake one
  step further while it is not finished, and returns every byte of application data that
  the records now complete hold (nothing stays decrypted inside, where the level-triggered
  epoll would not see it). No application data yet (a handshake step, a partial record) is
  ``BlockingIOError``, as for a socket with nothing to read.
* ``send`` encrypts at most ``SEND_CHUNK`` bytes and hands the records to the socket. When the
  socket does not take them all, the rest is kept and ``send`` answers 0 (nothing taken):
  the caller keeps those bytes and calls again with them first (``send_some``'s sender task
  does), and the call that finally writes the kept records answers their length. So the
  caller's accounting of what is unsent (the output buffer limit, the sender task) holds.
* A TLS error (a plaintext client, no certificate under ``tls-auth-clients yes``, a bad
  one) is an ``ssl.SSLError``, an ``OSError``: the turn closes that connection as for a reset,
  and ``TlsFront.refused`` logs one line per client address at most every ``LOG_EVERY_S``.
  A handshake not finished after ``HANDSHAKE_TIMEOUT_S`` is closed by ``TlsFront.sweep``.

``build_context`` turns the directives into an ``ssl.SSLContext`` or a ``TlsConfigError``
naming the file or value at fault: at start (the process exits with it) and at CONFIG SET of
a ``tls-*`` directive (the error is the reply, and the old context stays). New connections
take the front's current context; those already open keep theirs.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import ssl
from typing import TYPE_CHECKING, Any

from broker.config import Config
from node.bus_tls import BusContexts
from node.tls_stream import TlsStream, reason

if TYPE_CHECKING:
    from node.bus import LogLimiter
    from node.clock import Clock
    from node.connection import Connection

log = logging.getLogger("trisque")

# A client that has not finished its handshake after this long is closed (the idle timeout,
# off by default, does not apply to a connection that never sent a command).
HANDSHAKE_TIMEOUT_S = 10.0

_PROTOCOLS = {"tlsv1": ssl.TLSVersion.TLSv1, "tlsv1.1": ssl.TLSVersion.TLSv1_1,
              "tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}
_AUTH = {"yes": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "no": ssl.CERT_NONE}


class TlsConfigError(Exception):
    """The TLS directives do not make a usable context; the text says which and why."""


def _protocol_range(text: str) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    names = text.lower().split() or ["tlsv1.2", "tlsv1.3"]
    try:
        versions = sorted(_PROTOCOLS[name] for name in names)
    except KeyError:
        raise TlsConfigError("Invalid tls-protocols specified. Use a combination of 'TLSv1', "
                             "'TLSv1.1', 'TLSv1.2' and 'TLSv1.3'.") from None
    return versions[0], versions[-1]


def _openssl(context: ssl.SSLContext, function: str) -> tuple[Any, int]:
    """An OpenSSL function Python's ssl does not offer, and the context's SSL_CTX to call it
    on (the first field after the object header, in every CPython since 3.7), through the
    library the ``_ssl`` extension is linked with; AttributeError or OSError if absent."""
    import _ssl

    library = ctypes.CDLL(_ssl.__file__)
    call = getattr(library, function)
    handle = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    if not handle:
        raise OSError("no SSL_CTX")
    # The pointer is the context's only if OpenSSL reads the options Python set on it back:
    # a CPython whose layout moved gets Python's behaviour, not a call on the wrong object.
    get_options = library.SSL_CTX_get_options
    get_options.argtypes = [ctypes.c_void_p]
    get_options.restype = ctypes.c_uint64
    if get_options(handle) != int(context.options) & 0xFFFF_FFFF_FFFF_FFFF:
        raise OSError("the SSLContext's layout is not the one expected")
    return call, handle


def _set_ciphersuites(context: ssl.SSLContext, suites: str) -> None:
    """Python's ssl has no call for TLSv1.3's ciphersuites: OpenSSL's own."""
    try:
        setter, handle = _openssl(context, "SSL_CTX_set_ciphersuites")
    except (OSError, AttributeError):
        raise TlsConfigError("tls-ciphersuites is not supported by this Python's OpenSSL") from None
    setter.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    setter.restype = ctypes.c_int
    if setter(handle, suites.encode()) != 1:
        raise TlsConfigError(f"Failed to configure ciphersuites: {suites}")


# SSL_CTX_clear_mode is a macro over SSL_CTX_ctrl with these (openssl/ssl.h).
_SSL_CTRL_CLEAR_MODE = 78
_SSL_MODE_RELEASE_BUFFERS = 0x10


def _keep_buffers(context: ssl.SSLContext) -> None:
    """Python's contexts free a connection's TLS record buffers whenever they are empty
    (SSL_MODE_RELEASE_BUFFERS), so every record read or written allocates, clears and frees
    about 17 KB: measured, a good part of the TLS port's cost per request. Redis keeps them;
    so do we (about 34 KB per TLS connection). Without the call: Python's behaviour."""
    try:
        ctrl, handle = _openssl(context, "SSL_CTX_ctrl")
    except (OSError, AttributeError):
        return
    ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
    ctrl.restype = ctypes.c_long
    ctrl(handle, _SSL_CTRL_CLEAR_MODE, _SSL_MODE_RELEASE_BUFFERS, None)


def _no_passphrase() -> str:
    return ""


def tls_path(cfg: Config, name: str) -> str:
    """A ``tls-*`` file directive's value, relative to ``dir`` unless absolute (as Redis's
    paths are relative to the directory it runs in, which is its ``dir``)."""
    value = str(getattr(cfg, name.replace("-", "_")))
    if not value or os.path.isabs(value):
        return value
    return os.path.join(cfg.dir, value)


def _load_chain(context: ssl.SSLContext, cert: str, key: str, password: str) -> None:
    """``cert`` and its ``key`` into ``context``; an error names the file at fault."""
    # The certificate alone first, so that an error names the file at fault.
    try:
        ssl.create_default_context(cafile=cert)
    except (OSError, ValueError) as exc:
        raise TlsConfigError(f"Failed to load certificate: {cert}: {reason(exc)}") from None
    try:
        # Never None: OpenSSL would then ask for an encrypted key's passphrase on the
        # terminal, and the node would hang there.
        context.load_cert_chain(cert, key or None, password=password or _no_passphrase)
    except (OSError, ValueError) as exc:
        raise TlsConfigError(f"Failed to load private key: {key or cert}: "
                             f"{reason(exc)}") from None


def _load_authorities(context: ssl.SSLContext, cafile: str, capath: str) -> None:
    if capath and not os.path.isdir(capath):
        raise TlsConfigError("Failed to configure CA certificate(s) file/directory: "
                             f"{capath}: not a directory")
    try:
        context.load_verify_locations(cafile=cafile or None, capath=capath or None)
    except (OSError, ValueError) as exc:
        raise TlsConfigError("Failed to configure CA certificate(s) file/directory: "
                             f"{cafile or capath}: {reason(exc)}") from None


def _apply_policy(context: ssl.SSLContext, cfg: Config) -> None:
    """What every context of the node shares: ``tls-protocols``, ``tls-ciphers``,
    ``tls-ciphersuites``, ``tls-prefer-server-ciphers``, no compression, kept buffers."""
    lowest, highest = _protocol_range(cfg.tls_protocols)
    try:
        context.minimum_version, context.maximum_version = lowest, highest
    except ValueError as exc:  # OpenSSL built without one of them
        raise TlsConfigError(f"Invalid tls-protocols: {exc}") from None
    context.options |= ssl.OP_NO_COMPRESSION
    _keep_buffers(context)
    if cfg.tls_prefer_server_ciphers:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    if cfg.tls_ciphers:
        try:
            context.set_ciphers(cfg.tls_ciphers)
        except ssl.SSLError:
            raise TlsConfigError(f"Failed to configure ciphers: {cfg.tls_ciphers}") from None
    if cfg.tls_ciphersuites:
        _set_ciphersuites(context, cfg.tls_ciphersuites)


def build_context(cfg: Config) -> ssl.SSLContext:
    """The server context for the client port, from the ``tls-*`` directives (Redis's rules
    and messages), or ``TlsConfigError``."""
    if not cfg.tls_cert_file:
        raise TlsConfigError("No tls-cert-file configured!")
    if not cfg.tls_key_file:
        raise TlsConfigError("No tls-key-file configured!")
    auth = _AUTH[cfg.tls_auth_clients]
    cafile, capath = tls_path(cfg, "tls-ca-cert-file"), tls_path(cfg, "tls-ca-cert-dir")
    if auth != ssl.CERT_NONE and not (cafile or capath):
        raise TlsConfigError("Either tls-ca-cert-file or tls-ca-cert-dir must be specified "
                             "when tls-auth-clients is enabled!")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _apply_policy(context, cfg)
    _load_chain(context, tls_path(cfg, "tls-cert-file"), tls_path(cfg, "tls-key-file"),
                cfg.tls_key_file_pass)
    if cafile or capath:
        _load_authorities(context, cafile, capath)
    context.verify_mode = auth
    return context


def http_context(cfg: Config) -> ssl.SSLContext:
    """The HTTPS API's context (``http-tls yes``): the node's certificate, no client's asked
    for (requests authenticate as ACL users, docs/security.md)."""
    cert, key = tls_path(cfg, "tls-cert-file"), tls_path(cfg, "tls-key-file")
    if not cert:
        raise TlsConfigError("http-tls yes needs tls-cert-file and tls-key-file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _apply_policy(context, cfg)
    _load_chain(context, cert, key, cfg.tls_key_file_pass)
    context.set_alpn_protocols(["http/1.1"])
    return context


def bus_contexts(cfg: Config) -> BusContexts:
    """The bus's contexts (``tls-cluster yes``): mutual TLS both ways, peers trusted for the
    CA that signed them (dialled by address: no name check), as Redis's bus does."""
    cert, key = tls_path(cfg, "tls-cert-file"), tls_path(cfg, "tls-key-file")
    cafile, capath = tls_path(cfg, "tls-ca-cert-file"), tls_path(cfg, "tls-ca-cert-dir")
    if not cert or not (cafile or capath):
        raise TlsConfigError("tls-cluster yes needs tls-cert-file, tls-key-file and "
                             "tls-ca-cert-file (or tls-ca-cert-dir)")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for context in (server, client):
        _apply_policy(context, cfg)
        context.verify_mode = ssl.CERT_REQUIRED
        _load_authorities(context, cafile, capath)
    client.check_hostname = False
    server.num_tickets = 0  # links are long-lived and never resumed
    _load_chain(server, cert, key, cfg.tls_key_file_pass)
    client_cert = tls_path(cfg, "tls-client-cert-file")
    if client_cert:
        _load_chain(client, client_cert, tls_path(cfg, "tls-client-key-file"),
                    cfg.tls_client_key_file_pass)
    else:
        _load_chain(client, cert, key, cfg.tls_key_file_pass)
    return BusContexts(server, client)


class TlsFront:
    """The client port's TLS: the current context, the handshakes under way, the log."""

    def __init__(self, config: Config, clock: Clock, limiter: LogLimiter) -> None:
        self.config = config
        self.clock = clock
        self.limiter = limiter
        self.context = build_context(config)
        self.handshaking: dict[TlsStream, Connection] = {}
        self.refusals = 0  # handshakes that failed or were abandoned

    def build(self) -> ssl.SSLContext:
        """A context from the directives as they are now (``TlsConfigError`` if they make
        none), for the caller to install in ``context`` for new connections."""
        return build_context(self.config)

    def wrap(self, sock: socket.socket, addr: str) -> TlsStream:
        return TlsStream(sock, self, addr)

    def started(self, stream: TlsStream, conn: Connection) -> None:
        self.handshaking[stream] = conn

    def handshaken(self, stream: TlsStream) -> None:
        self.handshaking.pop(stream, None)

    def forget(self, stream: TlsStream) -> None:
        self.handshaking.pop(stream, None)

    def refused(self, stream: TlsStream, reason: str, level: int) -> None:
        self.refusals += 1
        host = stream.addr.rsplit(":", 1)[0]
        self.limiter.emit(f"tls:{host}", level,
                          f"Error accepting a client connection: {reason} (addr={stream.addr})")

    def sweep(self) -> int:
        """Close the connections whose handshake took longer than ``HANDSHAKE_TIMEOUT_S``."""
        now = self.clock.monotonic()
        late = [conn for stream, conn in self.handshaking.items()
                if now - stream.started > HANDSHAKE_TIMEOUT_S]
        for conn in late:
            stream = conn.sock
            if isinstance(stream, TlsStream):
                self.refused(stream, "TLS handshake timed out", logging.INFO)
            conn.close()
        return len(late)

