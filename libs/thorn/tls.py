"""TLS from certificate files: the HTTP API's server certificate, the CA a client trusts
(NATS, the entry point's upstreams, thornctl), an optional client certificate.

Every file is checked where it is read, before anything listens or connects: a missing or
unreadable file, a file that holds no certificate or no key, a key that does not match its
certificate, are a `TlsSettingError` naming the setting (THORN_TLS_CERT, THORN_NATS_CA, ...)
and the path, never the key's content. Keys are PEM and unencrypted (a service cannot type
a passphrase at start; the file's permissions protect it, as a Kubernetes Secret's do).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

__all__ = [
    "ServerFiles",
    "TlsSettingError",
    "check_ca",
    "client_context",
    "server_files",
]


class TlsSettingError(ValueError):
    """A TLS setting that cannot be used: `variable` names it, `path` is its file."""

    def __init__(self, variable: str, path: Path | str | None, problem: str) -> None:
        self.variable = variable
        self.path = str(path) if path is not None else None
        self.problem = problem
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.variable}={self.path}" if self.path is not None else self.variable
        return f"{where}: {self.problem}"


@dataclass(frozen=True, slots=True)
class ServerFiles:
    """A checked certificate (chain) and its private key."""

    cert: Path
    key: Path


def _read(path: Path, variable: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TlsSettingError(variable, path, "no such file") from None
    except IsADirectoryError:
        raise TlsSettingError(variable, path, "is a directory, not a PEM file") from None
    except OSError as exc:
        raise TlsSettingError(variable, path, f"cannot be read ({exc.strerror})") from None


def _certificates(path: Path, variable: str) -> list[x509.Certificate]:
    data = _read(path, variable)
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        certificates = []
    if not certificates:
        raise TlsSettingError(variable, path, "holds no PEM certificate")
    return certificates


def _check_key(path: Path, variable: str) -> None:
    data = _read(path, variable)
    try:
        serialization.load_pem_private_key(data, password=None)
    except TypeError:  # it wants a password
        raise TlsSettingError(
            variable, path, "the key is encrypted: give it unencrypted (protect the file)"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise TlsSettingError(variable, path, "holds no PEM private key") from None


def _pair(
    cert: Path | None, key: Path | None, cert_variable: str, key_variable: str
) -> ServerFiles | None:
    """Both files checked and matching, or None when neither is set."""
    if cert is None and key is None:
        return None
    if cert is None:
        raise TlsSettingError(cert_variable, None, f"not set, but {key_variable} is: give both")
    if key is None:
        raise TlsSettingError(key_variable, None, f"not set, but {cert_variable} is: give both")
    _certificates(cert, cert_variable)
    _check_key(key, key_variable)
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError:
        raise TlsSettingError(
            key_variable, key, f"is not the private key of the certificate in {cert_variable}"
        ) from None
    return ServerFiles(cert, key)


def server_files(
    cert: Path | None,
    key: Path | None,
    *,
    cert_variable: str = "THORN_TLS_CERT",
    key_variable: str = "THORN_TLS_KEY",
) -> ServerFiles | None:
    """The HTTP API's certificate and key, checked; None when neither is set (plain HTTP)."""
    return _pair(cert, key, cert_variable, key_variable)


def check_ca(ca: Path, variable: str) -> None:
    """`ca` holds at least one PEM certificate."""
    _certificates(ca, variable)


def client_context(
    ca: Path | None,
    *,
    ca_variable: str,
    cert: Path | None = None,
    key: Path | None = None,
    cert_variable: str = "",
    key_variable: str = "",
) -> ssl.SSLContext:
    """A client's TLS context: it verifies the server's certificate and name against `ca`
    (the system's CAs when None) and presents `cert`/`key` when given (for servers that
    verify their clients)."""
    if ca is not None:
        check_ca(ca, ca_variable)
    context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    pair = _pair(cert, key, cert_variable, key_variable)
    if pair is not None:
        context.load_cert_chain(pair.cert, pair.key)
    return context
