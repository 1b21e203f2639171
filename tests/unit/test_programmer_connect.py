"""Which identity each node of a programmer process connects with (THORN_NATS_CREDS)."""

from __future__ import annotations

from pathlib import Path

import pytest

from thorn.config import Settings
from thorn_programmer.connect import CredentialsSettingError, creds_of


def settings(creds: Path | None) -> Settings:
    return Settings(nats_creds=creds, data_dir=Path("/nonexistent"))


def test_without_credentials_the_nodes_share_one_unauthenticated_connection() -> None:
    assert creds_of(settings(None), ["leaf1", "leaf2"]) is None


def test_a_directory_gives_each_lab_node_its_own_creds_file(tmp_path: Path) -> None:
    for node in ("leaf1", "leaf2"):
        (tmp_path / f"{node}.creds").write_text("x")
    assert creds_of(settings(tmp_path), ["leaf1", "leaf2"]) == {
        "leaf1": tmp_path / "leaf1.creds",
        "leaf2": tmp_path / "leaf2.creds",
    }


def test_a_node_without_its_file_in_the_directory_is_named(tmp_path: Path) -> None:
    (tmp_path / "leaf1.creds").write_text("x")
    with pytest.raises(CredentialsSettingError, match=r"no leaf2\.creds \(nor for 1 more"):
        creds_of(settings(tmp_path), ["leaf1", "leaf2", "leaf3"])


def test_one_file_is_one_node_s_identity(tmp_path: Path) -> None:
    creds = tmp_path / "host1.creds"
    creds.write_text("x")
    assert creds_of(settings(creds), ["host1"]) == {"host1": creds}
    with pytest.raises(CredentialsSettingError, match="serves 2 nodes"):
        creds_of(settings(creds), ["host1", "host2"])
    with pytest.raises(CredentialsSettingError, match="does not exist"):
        creds_of(settings(tmp_path / "missing.creds"), ["host1"])
