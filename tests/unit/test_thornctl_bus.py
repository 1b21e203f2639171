"""`thornctl bus init|rotate|revoke`: a deployment's NATS trust material, written and changed
on the admin's machine (no API). (`thornctl bus creds` calls the API:
tests/integration/test_agent_credentials.py covers the endpoint.)"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from thorn.natsauth.files import AuthDir
from thorn.natsauth.issue import vnis_of
from thorn.natsauth.jwt import decode, new_key, read_creds
from thornctl.main import app


def thornctl(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def test_init_writes_the_servers_configuration_and_every_identity(tmp_path: Path) -> None:
    done = thornctl("bus", "init", str(tmp_path / "auth"), "--node", "gpu1")
    assert done.exit_code == 0, done.output
    auth = AuthDir.open(tmp_path / "auth", create=False)
    assert auth.server_config.read_text().startswith("operator: ")
    values = json.loads(auth.chart_values.read_text())
    assert set(values["config"]["merge"]) == {"operator", "system_account", "resolver",
                                              "resolver_preload"}  # fmt: skip
    for name, role in (("topology", "topology"), ("admin", "admin"), ("agents/gpu1", "agent")):
        token, _ = read_creds(auth.creds_path(name).read_text())
        assert decode(token).name.startswith(f"{role}:"), name
    token, _ = read_creds(auth.creds_path("agents/gpu1").read_text())
    assert vnis_of(decode(token)) == set()  # its VNIs come with the first renewal
    assert str(auth.issuer_seeds) in done.output.replace("\n", "")


def test_init_again_keeps_the_keys(tmp_path: Path) -> None:
    thornctl("bus", "init", str(tmp_path))
    before = AuthDir.open(tmp_path, create=False).trust
    assert thornctl("bus", "init", str(tmp_path)).exit_code == 0
    assert AuthDir.open(tmp_path, create=False).trust == before


def test_rotate_keeps_the_old_signing_key_until_retired(tmp_path: Path) -> None:
    thornctl("bus", "init", str(tmp_path))
    old = AuthDir.open(tmp_path, create=False).trust.issuer
    assert thornctl("bus", "rotate", str(tmp_path)).exit_code == 0
    rotated = AuthDir.open(tmp_path, create=False)
    assert rotated.trust.signing_keys[1] == old and rotated.trust.issuer != old
    assert rotated.issuer_seeds.read_text().splitlines() == [rotated.trust.issuer.seed, old.seed]
    assert thornctl("bus", "rotate", str(tmp_path), "--retire").exit_code == 0
    retired = AuthDir.open(tmp_path, create=False)
    assert retired.trust.signing_keys == (rotated.trust.issuer,)
    assert retired.issuer_seeds.read_text().splitlines() == [rotated.trust.issuer.seed]


def test_revoke_puts_the_key_in_the_account_and_refuses_what_is_not_a_user_key(
    tmp_path: Path,
) -> None:
    thornctl("bus", "init", str(tmp_path))
    user = new_key("user").public
    assert thornctl("bus", "revoke", str(tmp_path), user).exit_code == 0
    auth = AuthDir.open(tmp_path, create=False)
    assert user in auth.trust.revoked
    preload = json.loads(auth.chart_values.read_text())["config"]["merge"]["resolver_preload"]
    account = decode(preload[auth.trust.account.public])  # what the servers are given
    assert user in account.nats["revocations"]
    bad = thornctl("bus", "revoke", str(tmp_path), "UABC")
    assert bad.exit_code == 1 and "UABC" in bad.output


def test_a_directory_without_keys_is_named(tmp_path: Path) -> None:
    done = thornctl("bus", "rotate", str(tmp_path / "empty"))
    assert done.exit_code == 66 and "thornctl bus init" in done.output
