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
