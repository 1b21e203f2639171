"""Settings come from THORN_* variables; a misspelt one is reported, not silently dropped."""

from __future__ import annotations

import pytest

from thorn.config import Settings


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THORN_LISTEN", "0.0.0.0:9090")
    monkeypatch.setenv("THORN_NATS_URL", "nats://a:4222,nats://b:4222")
    settings = Settings()
    assert settings.host_port == ("0.0.0.0", 9090)
    assert settings.nats_url == "nats://a:4222,nats://b:4222"
    assert settings.db_url.startswith("sqlite+aiosqlite:///")


def test_a_misspelt_variable_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THORN_DATABSE_URL", "postgresql://x")
    monkeypatch.setenv("THORN_LOG_LEVEL", "debug")
    assert "THORN_DATABSE_URL" in Settings.unknown_environment()
    assert "THORN_LOG_LEVEL" not in Settings.unknown_environment()


def test_a_bad_value_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THORN_LOG_LEVEL", "loud")
    with pytest.raises(ValueError, match="log_level"):
        Settings()


def test_a_process_with_bad_settings_exits_78_naming_each_variable_never_its_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("THORN_ADMIN_TOKEN", "thn_my-own-secret")  # not a token's shape
    monkeypatch.setenv("THORN_TRUSTED_PROXIES", "10.0.0.1,gateway")
    with pytest.raises(SystemExit) as exited:
        Settings.from_environment("thorn-topology", arguments=[])
    assert exited.value.code == 78
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "thorn-topology: THORN_ADMIN_TOKEN: must be 'thn_' and 43 characters of A-Z, a-z, 0-9, "
        "'_', '-'",
        "thorn-topology: THORN_TRUSTED_PROXIES: 'gateway' is not an IP address or network",
    ]
    assert "my-own-secret" not in err


def test_trusted_proxies_are_normalised() -> None:
    settings = Settings(trusted_proxies=" 10.1.2.3/16, ::1 ,*", gateway_trusted_proxies="")
    assert settings.trusted_proxies == "10.1.0.0/16,::1,*"
    assert settings.gateway_trusted_proxies == ""
