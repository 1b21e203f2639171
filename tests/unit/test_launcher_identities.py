"""thorn-run's NATS identities: what it writes for the server, each service, the admin and
the lab's nodes (thorn_run.identities)."""

from __future__ import annotations

from pathlib import Path

from thorn.generators import leaf_spine
from thorn.natsauth.issue import vnis_of
from thorn.natsauth.jwt import decode, read_creds
from thorn_run.identities import Identities

NOW = 1_800_000_000.0


def claims_of(path: Path) -> tuple[str, set[int]]:
    token, _ = read_creds(path.read_text())
    claims = decode(token)
    return claims.name, vnis_of(claims)


def test_every_service_and_the_admin_get_their_own_creds_readable_by_the_owner_only(
    tmp_path: Path,
) -> None:
    made = Identities.provision(tmp_path, now=NOW)
    assert made.server_config.read_text().startswith("operator: ")
    for role in ("topology", "health", "pathcomp"):
        assert claims_of(made.services[role])[0] == f"{role}:{role}"
        assert oct(made.services[role].stat().st_mode & 0o777) == "0o600"
    assert claims_of(made.admin)[0] == "admin:admin"
    for seed in ("operator", "system", "account", "signing"):
        assert oct((made.auth.path / f"{seed}.seed").stat().st_mode & 0o777) == "0o600"


def test_the_keys_are_kept_across_runs_and_the_users_are_new(tmp_path: Path) -> None:
    first = Identities.provision(tmp_path, now=NOW)
    token_before = first.admin.read_text()
    again = Identities.provision(tmp_path, now=NOW + 60)
    assert again.auth.trust.account == first.auth.trust.account  # JetStream keeps its streams
    assert again.admin.read_text() != token_before


def test_only_topology_gets_the_signing_key_and_the_gateway_no_identity(tmp_path: Path) -> None:
    made = Identities.provision(tmp_path, now=NOW)
    assert made.env("topology")["THORN_NATS_ISSUER_SEED"] == str(made.auth.issuer_seeds)
    assert "THORN_NATS_ISSUER_SEED" not in made.env("health")
    assert made.env("health")["THORN_NATS_CREDS"] == str(made.services["health"])
    assert made.env("gateway") == {}


def test_each_lab_node_may_read_the_vnis_of_its_workloads(tmp_path: Path) -> None:
    made = Identities.provision(tmp_path, now=NOW)
    fabric = leaf_spine(2, 2, 2)
    hosts = sorted({w.node for w in fabric.workloads})
    nodes = sorted(n.name for n in fabric.nodes)
    folder = made.agents(fabric, nodes, now=NOW)
    name, vnis = claims_of(folder / f"{hosts[0]}.creds")
    assert name == f"agent:{hosts[0]}"
    assert vnis == {w.vni for w in fabric.workloads if w.node == hosts[0]} != set()
    switch = next(n for n in nodes if n not in hosts)
    assert claims_of(folder / f"{switch}.creds") == (f"agent:{switch}", set())
