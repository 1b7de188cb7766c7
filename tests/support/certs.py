"""Certificates for TLS tests, made by the same code as ``trisque certs``, and the SSL
contexts a test client needs to use them."""

from __future__ import annotations

import ssl
from pathlib import Path

from cli.certs import CertSet, generate


def make_certs(directory: Path, nodes: int = 3, organization: str = "trisque") -> CertSet:
    """A fresh CA with ``nodes`` node certificates and a client certificate in ``directory``.
    Call it twice with different directories (and organizations) for two unrelated CAs."""
    return generate(directory, nodes=nodes, days=2, organization=organization)


def client_context(certs: CertSet, with_cert: bool = True) -> ssl.SSLContext:
    """A client context that trusts ``certs``' CA and, with ``with_cert``, presents the
    client certificate (for ``tls-auth-clients yes``)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(certs.ca_cert))
    if with_cert:
        assert certs.client is not None
        context.load_cert_chain(str(certs.client[0]), str(certs.client[1]))
    return context
