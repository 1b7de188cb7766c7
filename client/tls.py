"""TLS to a node's ``tls-port``: the client side's options, as redis-cli names them, and the
context they make. Shared by the client library, ``trisque``, ``trisque-benchmark`` and the
Spark connector; ``TlsOptions`` is plain data, so it travels to worker processes and Spark
tasks, which make their own context."""

from __future__ import annotations

import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class TlsOptions:
    """redis-cli's ``--cacert``, ``--cacertdir``, ``--cert``, ``--key``, ``--insecure``,
    ``--sni`` and ``--tls-ciphers``; all empty: the system's CAs, no client certificate."""

    cacert: str | None = None
    cacertdir: str | None = None
    cert: str | None = None
    key: str | None = None
    insecure: bool = False
    sni: str | None = None
    ciphers: str | None = None
    # Whether the node's certificate must name the host connected to. redis-cli checks only
    # the chain (hiredis does not compare names): ``trisque`` and the benchmark do the same.
    check_hostname: bool = True

    def context(self) -> ssl.SSLContext:
        return tls_context(self.cacert, self.cacertdir, self.cert, self.key, self.insecure,
                           self.ciphers, self.check_hostname)


def tls_context(cacert: str | None = None, cacertdir: str | None = None,
                cert: str | None = None, key: str | None = None, insecure: bool = False,
                ciphers: str | None = None, check_hostname: bool = True) -> ssl.SSLContext:
    """A client context: trust ``cacert`` (a PEM file) and/or ``cacertdir`` (certificates
    named by hash), else the system's CAs; present ``cert``/``key`` for ``tls-auth-clients
    yes``; ``insecure`` checks nothing (the link is encrypted, but to whoever answers)."""
    context = ssl.create_default_context(cafile=cacert, capath=cacertdir)
    if insecure or not check_hostname:
        context.check_hostname = False
    if insecure:
        context.verify_mode = ssl.CERT_NONE
    if cert:
        context.load_cert_chain(cert, key)
    if ciphers:
        context.set_ciphers(ciphers)
    return context


def client_tls(tls: bool | ssl.SSLContext | TlsOptions | None) -> ssl.SSLContext | None:
    """A client's ``tls`` option as a context: True is the system's CAs, no certificate."""
    if tls is True:
        return tls_context()
    if isinstance(tls, TlsOptions):
        return tls.context()
    return tls or None
