"""thorn-run's NATS identities: the trust material in `<data dir>/nats-auth` (keys made once
and kept, see thorn.natsauth.files), the operator-mode configuration its nats-server runs
with, and a creds file for every service, the admin and each lab node, issued anew at every
start (so none outlives a run by much: services' expire after SERVICE_LIFETIME)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from thorn.model import FabricDocument
from thorn.natsauth import permissions
from thorn.natsauth.files import AuthDir
from thorn.natsauth.issue import ADMIN_LIFETIME, AGENT_LIFETIME, SERVICE_LIFETIME, agent_vnis

AUTH_DIR = "nats-auth"
# What thorn-run decides for its children itself (an admin's own would point elsewhere).
AUTH_VARIABLES = ("THORN_NATS_CREDS", "THORN_NATS_ISSUER_SEED")


@dataclass(frozen=True, slots=True)
class Identities:
    auth: AuthDir
    services: dict[str, Path]
    admin: Path

    @classmethod
    def provision(cls, data_dir: Path, *, now: float | None = None) -> Identities:
        """The keys (made on first use), the servers' configuration and fresh creds for the
        services and the admin."""
        at = time.time() if now is None else now
        auth = AuthDir.open(data_dir / AUTH_DIR)
        auth.write_server_config(now=at)
        services: dict[str, Path] = {}
        for role in permissions.SERVICES:
            held = permissions.service(role)
            services[role] = auth.write_creds(held, now=at, lifetime=SERVICE_LIFETIME, name=role)
        admin = auth.write_creds(permissions.admin(), now=at, lifetime=ADMIN_LIFETIME, name="admin")
        return cls(auth, services, admin)

    @property
    def server_config(self) -> Path:
        return self.auth.server_config

    def env(self, service: str) -> dict[str, str]:
        """A service child's NATS identity; topology also gets the signing key it issues
        agents' credentials with."""
        if service not in self.services:
            return {}
        out = {"THORN_NATS_CREDS": str(self.services[service])}
        if service == "topology":
            out["THORN_NATS_ISSUER_SEED"] = str(self.auth.issuer_seeds)
        return out

    def agents(self, fabric: FabricDocument, nodes: list[str], *, now: float | None = None) -> Path:
        """A creds file for each lab node, allowing the VNIs its workloads are in (topology
        renews them when that changes); returns their directory (THORN_NATS_CREDS of the
        lab's programmer)."""
        at = time.time() if now is None else now
        memberships = [(w.node, w.vni) for w in fabric.workloads]
        for node in nodes:
            held = permissions.agent(node, agent_vnis(memberships, node))
            self.auth.write_creds(held, now=at, lifetime=AGENT_LIFETIME, name=f"agents/{node}")
        return self.auth.path / "creds" / "agents"
