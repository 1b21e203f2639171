"""NATS over TLS against real nats-servers: who is refused, mutual TLS, and a cluster whose
routes speak TLS too. (test_bus.py runs the bus's own suite over TLS.)"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from pathlib import Path

import pytest
import structlog

from thorn import local_ca
from thorn.bus import Bus, BusConnectError
from thorn.events import LinkHealthChanged
from thorn.natsd import EmbeddedNats, NatsCluster, NatsServerTls
from thorn.tls import client_context

pytestmark = pytest.mark.nats

REFUSED_WITHIN = 2.0  # connect timeout for the clients that must not get in


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> local_ca.LocalCA:
    return local_ca.ensure(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> local_ca.LocalCA:
    return local_ca.ensure(tmp_path_factory.mktemp("other-ca"))


def info_of(port: int) -> dict[str, object]:
    """The INFO a server sends first on its client port, in plain text."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        line = sock.makefile("rb").readline()
    assert line.startswith(b"INFO "), line
    info: dict[str, object] = json.loads(line[5:])
    return info


def route_info_over_tls(port: int, context: ssl.SSLContext) -> dict[str, object]:
    """The INFO a route port sends once a TLS handshake with `context` is done."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        line = tls.makefile("rb").readline()
    assert line.startswith(b"INFO "), line
    info: dict[str, object] = json.loads(line[5:])
    return info


async def test_a_client_without_the_servers_ca_is_refused_and_told_why(
    ca: local_ca.LocalCA, other_ca: local_ca.LocalCA
) -> None:
    async with EmbeddedNats(tls=NatsServerTls(ca.cert, ca.key)) as server:
        assert info_of(server.port)["tls_required"] is True
        for trusting in (client_context(other_ca.ca, ca_variable="CA"), None):
            with pytest.raises(BusConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await Bus.connect(server.url, tls=trusting, connect_timeout=REFUSED_WITHIN)
        # with the CA it gets in
        async with await Bus.connect(
            server.url, tls=client_context(ca.ca, ca_variable="CA")
        ) as bus:
            assert bus.is_connected


async def test_a_client_with_a_ca_refuses_a_server_that_does_not_speak_tls(
    ca: local_ca.LocalCA,
) -> None:
    async with EmbeddedNats() as plain:
        with (
            structlog.testing.capture_logs() as events,
            pytest.raises(BusConnectError, match="does not use TLS"),
        ):
            await Bus.connect(plain.url, tls=client_context(ca.ca, ca_variable="CA"))
    # its own refusal is not an outage
    assert not [e for e in events if e["event"] == "nats_disconnected"]


async def test_a_server_that_verifies_clients_takes_only_those_with_a_certificate_of_its_ca(
    ca: local_ca.LocalCA, other_ca: local_ca.LocalCA
) -> None:
    demanding = NatsServerTls(ca.cert, ca.key, ca=ca.ca, verify_clients=True)
    async with EmbeddedNats(tls=demanding) as server:
        presenting = client_context(ca.ca, ca_variable="CA", cert=ca.cert, key=ca.key,
                                    cert_variable="C", key_variable="K")  # fmt: skip
        async with await Bus.connect(server.url, tls=presenting) as bus:
            await bus.ensure_streams()
            assert await bus.publish(LinkHealthChanged.model_validate({
                "link_id": 1, "state": "down", "previous": "up",
                "at": "2026-12-04T12:00:00Z", "source": "bfd"})) is not None  # fmt: skip
        anonymous = client_context(ca.ca, ca_variable="CA")
        stranger = client_context(ca.ca, ca_variable="CA", cert=other_ca.cert, key=other_ca.key,
                                  cert_variable="C", key_variable="K")  # fmt: skip
        for refused in (anonymous, stranger):
            with pytest.raises(BusConnectError):
                await Bus.connect(server.url, tls=refused, connect_timeout=REFUSED_WITHIN)
        assert "TLS handshake error" in server.log_tail(50)


def test_a_cluster_speaks_tls_on_its_routes_and_keeps_three_copies_over_them(
    ca: local_ca.LocalCA, tmp_path: Path
) -> None:
    with NatsCluster(3, tls=NatsServerTls(ca.cert, ca.key, ca=ca.ca),
                     base_dir=tmp_path) as cluster:  # fmt: skip
        # healthy: each server joined the JetStream meta group over its routes
        peer = client_context(ca.ca, ca_variable="CA", cert=ca.cert, key=ca.key,
                              cert_variable="C", key_variable="K")  # fmt: skip
        for index in range(3):
            # a route port answers only after a TLS handshake with a certificate of the CA
            assert route_info_over_tls(cluster.route_port(index), peer)["cluster"] == "thorn"
            assert info_of(cluster.servers[index].port)["tls_required"] is True

        async def publish_replicated() -> int | None:
            trusting = client_context(ca.ca, ca_variable="CA")
            async with await Bus.connect(cluster.url, tls=trusting, replicas=3) as bus:
                await bus.ensure_streams()
                return await bus.publish(LinkHealthChanged.model_validate({
                    "link_id": 7, "state": "down", "previous": "up",
                    "at": "2026-12-04T12:00:00Z", "source": "bfd"}))  # fmt: skip

        assert asyncio.run(publish_replicated()) == 1
        replicas = cluster.streams(0)["THORN_HEALTH"]["cluster"]
        assert len(replicas.get("replicas", [])) == 2, "a leader and two followers"


def test_a_server_that_is_not_in_the_ca_cannot_join_a_tls_cluster(
    ca: local_ca.LocalCA, other_ca: local_ca.LocalCA, tmp_path: Path
) -> None:
    with NatsCluster(3, tls=NatsServerTls(ca.cert, ca.key, ca=ca.ca),
                     base_dir=tmp_path / "c") as cluster:  # fmt: skip
        route = f"nats://127.0.0.1:{cluster.route_port(0)}"
        intruder = EmbeddedNats(
            tls=NatsServerTls(other_ca.cert, other_ca.key, ca=other_ca.ca),
            route_tls=NatsServerTls(other_ca.cert, other_ca.key, ca=other_ca.ca),
            extra_args=("--server_name", "intruder", "--cluster_name", cluster.name,
                        "--cluster", "nats://127.0.0.1:-1", "--routes", route),
            log_dir=tmp_path / "intruder",
        )  # fmt: skip
        with intruder:
            end = time.monotonic() + 10
            while "TLS route handshake error" not in cluster.servers[0].log_tail(200):
                assert time.monotonic() < end, "server n1 never refused the intruder's route"
                time.sleep(0.1)
            routes = cluster.monitor(0, "routez")["routes"]
            assert "intruder" not in {r.get("remote_name") for r in routes}
