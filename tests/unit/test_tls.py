"""TLS from files: the local CA that `make run` makes, and the checks that name the setting at
fault. Handshakes run in memory (ssl.MemoryBIO), with Python's own TLS on both ends."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from thorn import local_ca
from thorn.config import Settings
from thorn.tls import TlsSettingError, client_context, server_files
from thorn_run.launcher import local_tls

NOW = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.UTC)


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> None:
    """A full TLS handshake between the two contexts in memory; ssl.SSLError if refused."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    tls_client = client.wrap_bio(c_in, c_out, server_hostname=name)
    tls_server = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for side, obj in (("client", tls_client), ("server", tls_server)):
            if not done[side]:
                try:
                    obj.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError("the handshake did not finish")


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


@pytest.fixture
def ca(tmp_path: Path) -> local_ca.LocalCA:
    return local_ca.ensure(tmp_path / "tls", ["localhost", "127.0.0.1", "::1", "thorn.lab"])


# --- the local CA ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["localhost", "127.0.0.1", "::1", "thorn.lab"])
def test_a_client_that_trusts_the_local_ca_accepts_the_server_under_each_name(
    ca: local_ca.LocalCA, name: str
) -> None:
    trusting = client_context(ca.ca, ca_variable="THORN_CA")
    handshake(server_context(ca.cert, ca.key), trusting, name)


def test_a_name_the_certificate_does_not_carry_is_refused(ca: local_ca.LocalCA) -> None:
    trusting = client_context(ca.ca, ca_variable="THORN_CA")
    with pytest.raises(ssl.SSLCertVerificationError, match="match"):
        handshake(server_context(ca.cert, ca.key), trusting, "elsewhere.example")


def test_a_client_that_trusts_another_ca_refuses_the_server(
    ca: local_ca.LocalCA, tmp_path: Path
) -> None:
    other = local_ca.ensure(tmp_path / "other")
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        handshake(server_context(ca.cert, ca.key), client_context(other.ca, ca_variable="X"),
                  "localhost")  # fmt: skip


def test_keys_are_private_to_their_owner(ca: local_ca.LocalCA) -> None:
    assert ca.key.stat().st_mode & 0o777 == 0o600
    assert ca.ca_key.stat().st_mode & 0o777 == 0o600
    assert ca.cert.stat().st_mode & 0o077 == 0o044  # certificates are public


def test_the_server_certificate_serves_both_ends_of_a_nats_route(ca: local_ca.LocalCA) -> None:
    cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {u.dotted_string for u in usage} == {"1.3.6.1.5.5.7.3.1", "1.3.6.1.5.5.7.3.2"}
    # the route's client end presents it to a server that verifies its clients
    verifying = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca.ca))
    verifying.load_cert_chain(ca.cert, ca.key)
    verifying.verify_mode = ssl.CERT_REQUIRED
    presenting = client_context(ca.ca, ca_variable="X", cert=ca.cert, key=ca.key,
                                cert_variable="C", key_variable="K")  # fmt: skip
    handshake(verifying, presenting, "127.0.0.1")


def test_a_second_run_keeps_the_ca_and_the_certificate(ca: local_ca.LocalCA) -> None:
    before = {p: p.read_bytes() for p in (ca.ca, ca.ca_key, ca.cert, ca.key)}
    again = local_ca.ensure(ca.directory, ["localhost", "127.0.0.1", "::1", "thorn.lab"])
    assert not again.issued
    assert {p: p.read_bytes() for p in before} == before


def test_a_new_name_gets_a_new_certificate_from_the_same_ca(ca: local_ca.LocalCA) -> None:
    kept_ca = ca.ca.read_bytes()
    old_cert = ca.cert.read_bytes()
    again = local_ca.ensure(ca.directory, ["localhost", "10.1.2.3"])
    assert again.issued
    assert ca.ca.read_bytes() == kept_ca  # clients that trust it keep working
    assert ca.cert.read_bytes() != old_cert
    handshake(server_context(ca.cert, ca.key), client_context(ca.ca, ca_variable="X"),
              "10.1.2.3")  # fmt: skip


def test_a_certificate_near_its_end_is_issued_again(tmp_path: Path) -> None:
    first = local_ca.ensure(tmp_path, now=NOW)
    old_cert = first.cert.read_bytes()
    later = NOW + dt.timedelta(days=local_ca.SERVER_DAYS) - local_ca.RENEW_BEFORE / 2
    again = local_ca.ensure(tmp_path, now=later)
    assert again.issued
    assert first.cert.read_bytes() != old_cert
    cert = x509.load_pem_x509_certificate(first.cert.read_bytes())
    assert cert.not_valid_after_utc > later + local_ca.RENEW_BEFORE


def test_a_damaged_server_key_is_replaced(ca: local_ca.LocalCA) -> None:
    ca.key.write_text("not a key\n")
    again = local_ca.ensure(ca.directory, ["localhost"])
    assert again.issued
    server_files(ca.cert, ca.key)  # a matching pair again


def test_a_lost_ca_key_makes_a_new_ca_and_certificate(ca: local_ca.LocalCA) -> None:
    old_ca = ca.ca.read_bytes()
    ca.ca_key.unlink()
    again = local_ca.ensure(ca.directory, ["localhost"])
    assert again.issued
    assert ca.ca.read_bytes() != old_ca
    handshake(server_context(ca.cert, ca.key), client_context(ca.ca, ca_variable="X"),
              "localhost")  # fmt: skip


def test_thorn_run_names_loopback_this_host_and_the_listen_address(tmp_path: Path) -> None:
    import socket

    settings = Settings(tls="local", listen="192.0.2.7:8443", data_dir=tmp_path)
    made = local_tls(settings, tmp_path)
    cert = x509.load_pem_x509_certificate(made.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(n.value) for n in names} >= {"localhost", "127.0.0.1", "::1", "192.0.2.7",
                                             socket.gethostname()}  # fmt: skip
    assert made.directory == tmp_path / "tls"


def test_thorn_run_refuses_local_tls_together_with_given_files(tmp_path: Path) -> None:
    settings = Settings(tls="local", tls_cert=tmp_path / "c.pem", tls_key=tmp_path / "k.pem")
    with pytest.raises(ValueError, match="THORN_TLS_CERT"):
        local_tls(settings, tmp_path)


# --- bad files: an error naming the setting ---------------------------------------------------


def test_no_certificate_and_no_key_is_plain_http() -> None:
    assert server_files(None, None) is None
    assert Settings().https is None
    assert Settings().nats_tls is None


def test_a_missing_certificate_file_names_its_variable(
    tmp_path: Path, ca: local_ca.LocalCA
) -> None:
    with pytest.raises(TlsSettingError) as caught:
        server_files(tmp_path / "nope.pem", ca.key)
    assert caught.value.variable == "THORN_TLS_CERT"
    assert str(caught.value) == f"THORN_TLS_CERT={tmp_path / 'nope.pem'}: no such file"


def test_an_unreadable_key_file_names_its_variable(tmp_path: Path, ca: local_ca.LocalCA) -> None:
    with pytest.raises(TlsSettingError, match=r"^THORN_TLS_KEY=.*: is a directory"):
        server_files(ca.cert, tmp_path)


def test_a_key_without_its_certificate_names_the_missing_one(ca: local_ca.LocalCA) -> None:
    with pytest.raises(TlsSettingError, match=r"^THORN_TLS_CERT: not set, but THORN_TLS_KEY is"):
        server_files(None, ca.key)


def test_a_certificate_file_that_holds_no_certificate_says_so(
    tmp_path: Path, ca: local_ca.LocalCA
) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("hello\n")
    with pytest.raises(TlsSettingError, match=r"^THORN_TLS_CERT=.*: holds no PEM certificate"):
        server_files(junk, ca.key)
    # the key in the certificate's place is not a certificate either
    with pytest.raises(TlsSettingError, match=r"^THORN_TLS_CERT=.*: holds no PEM certificate"):
        server_files(ca.key, ca.key)


def test_a_key_that_is_not_the_certificates_names_the_key_and_never_shows_it(
    tmp_path: Path, ca: local_ca.LocalCA
) -> None:
    other = local_ca.ensure(tmp_path / "other")
    with pytest.raises(TlsSettingError) as caught:
        server_files(ca.cert, other.key)
    assert caught.value.variable == "THORN_TLS_KEY"
    assert "is not the private key of the certificate in THORN_TLS_CERT" in str(caught.value)
    secret = "".join(other.key.read_text().splitlines()[1:-1])
    assert secret[:16] not in str(caught.value)


def test_an_encrypted_key_is_refused_with_the_reason(tmp_path: Path, ca: local_ca.LocalCA) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    locked = tmp_path / "locked.pem"
    locked.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    ))  # fmt: skip
    with pytest.raises(TlsSettingError, match=r"^THORN_TLS_KEY=.*: the key is encrypted"):
        server_files(ca.cert, locked)


def test_the_nats_settings_name_their_own_variables(tmp_path: Path, ca: local_ca.LocalCA) -> None:
    with pytest.raises(TlsSettingError, match=r"^THORN_NATS_CA=.*: no such file"):
        Settings(nats_ca=tmp_path / "missing.pem").nats_tls  # noqa: B018
    with pytest.raises(TlsSettingError, match=r"^THORN_NATS_KEY: not set, but THORN_NATS_CERT"):
        Settings(nats_ca=ca.ca, nats_cert=ca.cert).nats_tls  # noqa: B018
    with pytest.raises(TlsSettingError, match=r"^THORN_TLS_CA=.*: holds no PEM certificate"):
        Settings(tls_ca=ca.key).upstream_tls  # noqa: B018
    context = Settings(nats_ca=ca.ca).nats_tls
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED


def test_an_empty_setting_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THORN_TLS_CERT", "")
    monkeypatch.setenv("THORN_NATS_CA", "")
    settings = Settings()
    assert settings.tls_cert is None and settings.nats_ca is None
