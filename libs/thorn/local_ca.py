"""A local certificate authority for `make run` with THORN_TLS=local: a CA and one server
certificate signed by it, kept in a directory (THORN_DATA_DIR/tls) and reused across runs.

- `ca.pem`: the CA's certificate. Clients trust it: thornctl --ca (THORN_CA), curl
  --cacert, THORN_NATS_CA, a browser that imports it.
- `server.pem`, `server-key.pem`: the entry point's HTTPS and the embedded nats-server's
  TLS (client connections and, on a cluster, routes: the certificate is good for both ends).
- `ca-key.pem`: the CA's key, kept to issue the next server certificate. Keys are written
  0600 and never leave the directory.

A run keeps what is there while it is usable: the CA until 30 days before it expires, the
server certificate while it is signed by that CA, names every name asked for and has more
than 30 days left. Otherwise it is issued again (a new CA means clients must trust the new
`ca.pem`). ECDSA P-256 keys: quick to make and accepted by every TLS client THORN has.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CA_DAYS", "LOOPBACK_NAMES", "RENEW_BEFORE", "SERVER_DAYS", "LocalCA", "ensure"]

CA_DAYS = 3650
SERVER_DAYS = 397  # what browsers accept for a server certificate
RENEW_BEFORE = dt.timedelta(days=30)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True, slots=True)
class LocalCA:
    directory: Path
    issued: bool  # this call made a new server certificate (and perhaps a new CA)

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca-key.pem"

    @property
    def cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def key(self) -> Path:
        return self.directory / "server-key.pem"


def ensure(
    directory: Path, names: Iterable[str] = LOOPBACK_NAMES, now: dt.datetime | None = None
) -> LocalCA:
    """The CA and a server certificate for `names` (host names and IP addresses) in
    `directory`: kept when still usable, else made anew."""
    now = now or dt.datetime.now(dt.UTC)
    wanted = _alt_names(names)
    directory.mkdir(parents=True, exist_ok=True)
    paths = LocalCA(directory, issued=False)
    ca = _usable_ca(paths, now)
    if ca is None:
        ca = _new_ca(paths, now)
    elif _usable_server(paths, ca[0], wanted, now):
        return paths
    _new_server(paths, ca, wanted, now)
    return LocalCA(directory, issued=True)


# --- reading what is there -----------------------------------------------------------------


def _load_cert(path: Path) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey | None:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def _same_key(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    return _public(cert.public_key()) == _public(key.public_key())


def _public(key: object) -> bytes:
    if not isinstance(key, ec.EllipticCurvePublicKey):
        return b""
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _fresh(cert: x509.Certificate, now: dt.datetime) -> bool:
    return cert.not_valid_before_utc <= now and now + RENEW_BEFORE < cert.not_valid_after_utc


def _usable_ca(
    paths: LocalCA, now: dt.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    cert, key = _load_cert(paths.ca), _load_key(paths.ca_key)
    if cert is None or key is None or not _fresh(cert, now):
        return None
    if not _same_key(cert, key):
        return None
    return cert, key


def _usable_server(
    paths: LocalCA, ca: x509.Certificate, wanted: list[x509.GeneralName], now: dt.datetime
) -> bool:
    cert, key = _load_cert(paths.cert), _load_key(paths.key)
    if cert is None or key is None or not _fresh(cert, now):
        return False
    if not _same_key(cert, key):
        return False
    try:
        cert.verify_directly_issued_by(ca)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return False
    return all(name in names for name in wanted)


# --- issuing -------------------------------------------------------------------------------


def _alt_names(names: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in dict.fromkeys(n.strip() for n in names if n.strip()):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def _write(path: Path, data: bytes, private: bool) -> None:
    """Written whole under a temporary name, then renamed: never seen half; a key 0600 from
    the moment it exists."""
    partial = path.with_name(f".{path.name}.tmp")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    partial.replace(path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _key_usage(*, sign_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=sign_certificates,
        crl_sign=sign_certificates,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def _new_ca(
    paths: LocalCA, now: dt.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "THORN"),
        x509.NameAttribute(NameOID.COMMON_NAME, f"THORN local CA {now:%Y-%m-%d %H:%M:%S}"),
    ])  # fmt: skip
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(sign_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(paths.ca_key, _key_pem(key), private=True)
    _write(paths.ca, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return cert, key


def _new_server(
    paths: LocalCA,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    names: list[x509.GeneralName],
    now: dt.datetime,
) -> None:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    first = names[0].value if names else "localhost"
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "THORN"),
        x509.NameAttribute(NameOID.COMMON_NAME, str(first)),
    ])  # fmt: skip
    # Server and client: a NATS route connects as a client with the same certificate.
    usage = x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + dt.timedelta(days=SERVER_DAYS), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(_key_usage(sign_certificates=False), critical=True)
        .add_extension(usage, critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(paths.key, _key_pem(key), private=True)
    _write(paths.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)


def main(argv: list[str] | None = None) -> None:
    """`python -m thorn.local_ca DIR [NAME ...]`: a CA and a server certificate for the names
    (default: loopback), for a deployment's secrets (docs/operations.md, "TLS")."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m thorn.local_ca",
        description="Make (or keep) a local CA and a server certificate signed by it.",
    )
    parser.add_argument("directory", type=Path, help="where ca.pem, server.pem and the keys go")
    parser.add_argument("names", nargs="*", default=list(LOOPBACK_NAMES),
                        help="host names and IP addresses the certificate names")  # fmt: skip
    args = parser.parse_args(argv)
    made = ensure(args.directory, args.names)
    print(f"{'issued' if made.issued else 'kept'}: {made.cert} (key {made.key}), CA {made.ca}")


if __name__ == "__main__":
    main()
