"""``trisque certs DIR [--nodes N] [--days D]``: certificates for a test or private cluster.

Writes a certificate authority (``ca.crt``, ``ca.key``), one certificate per node
(``node-1.crt``/``node-1.key`` …, each valid for ``127.0.0.1``, ``::1``, ``localhost`` and the
node's name, for both the server and the client side, since a bus link presents the node's
certificate in either role) and one client certificate (``client.crt``/``client.key``) for
``tls-auth-clients yes``. Keys are ECDSA P-256: small, and the fastest handshake Python's ssl
offers. Private keys are written mode 0600, and nothing is overwritten without ``--force``.

This is for tests and private networks; a production cluster should use its own PKI, and
docs/security.md says how to point the node at it.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOCAL_NAMES = ("localhost",)
LOCAL_ADDRESSES = ("127.0.0.1", "::1")


@dataclass
class CertSet:
    """The files one run wrote: the CA's, each node's (in order) and the client's."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    nodes: list[tuple[Path, Path]] = field(default_factory=list)
    client: tuple[Path, Path] | None = None

    def paths(self) -> list[Path]:
        out = [self.ca_cert, self.ca_key]
        for cert, key in self.nodes:
            out += [cert, key]
        if self.client is not None:
            out += list(self.client)
        return out


def _name(common: str, organization: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _validity(builder: x509.CertificateBuilder, days: int) -> x509.CertificateBuilder:
    # A minute back, so a peer whose clock is slightly behind accepts a fresh certificate.
    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
    return builder.not_valid_before(start).not_valid_after(start + datetime.timedelta(days=days))


def _authority(organization: str, days: int) -> tuple[x509.Certificate,
                                                      ec.EllipticCurvePrivateKey]:
    key = _key()
    name = _name(f"{organization} CA", organization)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                            crl_sign=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                              critical=False))
    return _validity(builder, days).sign(key, hashes.SHA256()), key


def _leaf(common: str, organization: str, days: int, ca: x509.Certificate,
          ca_key: ec.EllipticCurvePrivateKey, dns: list[str],
          addresses: list[str]) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    builder = (x509.CertificateBuilder().subject_name(_name(common, organization))
               .issuer_name(ca.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]),
                              critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   ca_key.public_key()), critical=False))
    alt: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
    alt += [x509.IPAddress(ipaddress.ip_address(address)) for address in addresses]
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return _validity(builder, days).sign(ca_key, hashes.SHA256()), key


def _write(path: Path, data: bytes, private: bool) -> None:
    # A key is created 0600 from the start, so it is never readable by others even briefly.
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600 if private else 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    if private:
        os.chmod(path, 0o600)


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def planned(directory: Path, nodes: int) -> CertSet:
    """The file names a run with ``nodes`` nodes writes in ``directory``."""
    certs = CertSet(directory, directory / "ca.crt", directory / "ca.key")
    for index in range(1, nodes + 1):
        certs.nodes.append((directory / f"node-{index}.crt", directory / f"node-{index}.key"))
    certs.client = (directory / "client.crt", directory / "client.key")
    return certs


def generate(directory: Path | str, nodes: int = 3, days: int = 365,
             organization: str = "trisque", hosts: tuple[str, ...] = (),
             force: bool = False) -> CertSet:
    """Write a CA, ``nodes`` node certificates and a client certificate into ``directory``
    (created if missing). ``hosts`` adds names or addresses to every node's SANs. Raises
    ``FileExistsError`` naming the first file that exists, unless ``force``."""
    if nodes < 0 or days < 1:
        raise ValueError("--nodes must be >= 0 and --days >= 1")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    certs = planned(path, nodes)
    if not force:
        for existing in certs.paths():
            if existing.exists():
                raise FileExistsError(f"{existing} exists (use --force to overwrite)")
    dns = list(LOCAL_NAMES)
    addresses = list(LOCAL_ADDRESSES)
    for host in hosts:
        try:
            ipaddress.ip_address(host)
            addresses.append(host)
        except ValueError:
            dns.append(host)
    ca, ca_key = _authority(organization, days)
    _write(certs.ca_cert, _pem_cert(ca), private=False)
    _write(certs.ca_key, _pem_key(ca_key), private=True)
    for index, (cert_path, key_path) in enumerate(certs.nodes, start=1):
        name = f"node-{index}"
        cert, key = _leaf(name, organization, days, ca, ca_key, [name, *dns], addresses)
        _write(cert_path, _pem_cert(cert), private=False)
        _write(key_path, _pem_key(key), private=True)
    assert certs.client is not None
    cert, key = _leaf("client", organization, days, ca, ca_key, [], [])
    _write(certs.client[0], _pem_cert(cert), private=False)
    _write(certs.client[1], _pem_key(key), private=True)
    return certs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trisque certs",
        description="Make a certificate authority, node certificates and a client "
                    "certificate for a TLS test cluster (docs/security.md).")
    parser.add_argument("directory", help="where to write the files (created if missing)")
    parser.add_argument("--nodes", type=int, default=3, help="node certificates (default 3)")
    parser.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    parser.add_argument("--host", action="append", default=[], metavar="NAME_OR_ADDRESS",
                        help="another name or IP address for every node certificate "
                             "(repeatable; 127.0.0.1, ::1 and localhost are always in)")
    parser.add_argument("--force", action="store_true", help="overwrite existing files")
    args = parser.parse_args(argv)
    try:
        certs = generate(args.directory, nodes=args.nodes, days=args.days,
                         hosts=tuple(args.host), force=args.force)
    except (FileExistsError, ValueError) as exc:
        sys.stderr.write(f"trisque certs: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"trisque certs: cannot write to {args.directory}: "
                         f"{exc.strerror or exc}\n")
        return 1
    out = sys.stdout
    out.write(f"CA:      {certs.ca_cert} (key {certs.ca_key}: keep it private)\n")
    for index, (cert, key) in enumerate(certs.nodes, start=1):
        out.write(f"node {index}:  {cert} {key}\n")
    if certs.client is not None:
        out.write(f"client:  {certs.client[0]} {certs.client[1]}\n")
    out.write(f"valid for {args.days} days. A node uses: tls-cert-file {certs.directory}/"
              f"node-1.crt, tls-key-file {certs.directory}/node-1.key, tls-ca-cert-file "
              f"{certs.ca_cert}\n")
    return 0
