"""Settings every THORN process reads from the environment (THORN_*), built in app factories."""

from __future__ import annotations

import ipaddress
import os
import ssl
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from thorn.auth import TOKEN_FORMAT, TOKEN_PATTERN
from thorn.store import PoolSettings, sqlite_url
from thorn.tls import ServerFiles, client_context, server_files

KiB = 1024
MiB = 1024 * KiB


class Settings(BaseSettings):
    # Errors never echo a value: it may be a secret (THORN_ADMIN_TOKEN, a database URL).
    model_config = SettingsConfigDict(
        env_prefix="THORN_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    data_dir: Path = Field(Path(".thorn"), description="where the embedded SQLite file lives")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default SQLite file")
    db_pool_size: int = Field(
        20, ge=1, le=1000, description="PostgreSQL: connections each process keeps open"
    )
    db_max_overflow: int = Field(
        10, ge=0, le=1000, description="PostgreSQL: connections opened beyond the pool under load"
    )
    db_pool_timeout_s: float = Field(
        10.0, gt=0, le=300,
        description="PostgreSQL: longest wait for a free connection (then 503), and for the "
        "outcome of a COMMIT whose connection was lost",
    )  # fmt: skip
    db_pool_recycle_s: int = Field(
        1800, ge=1, le=86_400, description="PostgreSQL: a connection older than this is replaced"
    )
    db_statement_timeout_ms: int = Field(
        30_000, ge=0, le=3_600_000,
        description="PostgreSQL: the server cancels a statement that runs longer (503); 0: none",
    )  # fmt: skip
    db_connect_timeout_s: int = Field(
        5, ge=2, le=300, description="PostgreSQL: longest wait to open a connection"
    )
    nats_url: str = Field("nats://127.0.0.1:4222", description="NATS server(s), comma-separated")
    nats_replicas: int = Field(
        1, ge=1, le=5,
        description="copies of every JetStream stream and KV bucket THORN creates: 1 on one "
        "NATS server, 3 on a 3-server cluster; at most the cluster's size",
    )  # fmt: skip
    nats_ca: Path | None = Field(
        None,
        description="NATS over TLS: the CA certificates (PEM) the servers' certificates are "
        "verified with; set, a server that does not speak TLS is refused",
    )
    nats_cert: Path | None = Field(
        None, description="NATS over TLS: a client certificate (PEM), for servers that verify "
        "their clients; with THORN_NATS_KEY",
    )  # fmt: skip
    nats_key: Path | None = Field(None, description="NATS over TLS: THORN_NATS_CERT's key (PEM)")
    nats_creds: Path | None = Field(
        None,
        description="this process's NATS identity: a .creds file (user JWT and seed, 0600; "
        "docs/operations.md 'Bus identities'); the programmer serving a lab: a directory of "
        "<node>.creds; unset: connect without credentials (a server without auth)",
    )
    nats_issuer_seed: Path | None = Field(
        None,
        description="topology: the THORN account's signing key seeds (issuer.seeds, 0600: one "
        "per line, the current first), with which it issues and renews agents' NATS "
        "credentials; needs THORN_NATS_CREDS; unset: it issues none",
    )
    admin_token: SecretStr | None = Field(
        None,
        description="bootstrap admin bearer token: 'thn_' and 43 characters of A-Z, a-z, 0-9, "
        "'_', '-' (python3 -c \"import secrets; print('thn_' + secrets.token_urlsafe(32))\")",
    )
    trusted_proxies: str = Field(
        "127.0.0.1,::1",
        description="services: addresses or networks (comma-separated) whose X-Forwarded-For "
        "names the client (the entry point's); empty: none",
    )
    gateway_trusted_proxies: str = Field(
        "",
        description="entry point: addresses or networks of proxies in front of it (a load "
        "balancer) whose X-Forwarded-For names the client; default none: the peer is the client",
    )
    auth_failure_limit: int = Field(
        10, ge=1, le=1_000_000,
        description="entry point: failed authentications a client address may make within "
        "THORN_AUTH_FAILURE_WINDOW_S before it is answered 429",
    )  # fmt: skip
    auth_failure_window_s: float = Field(
        60.0, gt=0, le=86_400, description="entry point: the window of THORN_AUTH_FAILURE_LIMIT"
    )
    listen: str = Field("127.0.0.1:8080", description="host:port of the HTTP API")
    tls_cert: Path | None = Field(
        None,
        description="HTTPS: the certificate (PEM, its chain after it) this process serves its "
        "HTTP API with; with THORN_TLS_KEY. Unset: plain HTTP",
    )
    tls_key: Path | None = Field(
        None, description="HTTPS: THORN_TLS_CERT's private key (PEM, unencrypted; keep it 0600)"
    )
    tls_ca: Path | None = Field(
        None,
        description="entry point: the CA certificates (PEM) https:// upstreams are verified "
        "with; default: the system's",
    )
    tls: Literal["off", "local"] = Field(
        "off",
        description="thorn-run: local: make a local CA and certificates in THORN_DATA_DIR/tls "
        "and serve the API over HTTPS and NATS over TLS with them",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
    max_body_bytes: int = Field(1 * MiB, ge=1 * KiB, description="limit for ordinary requests")
    max_import_bytes: int = Field(
        64 * MiB, ge=1 * KiB, description="limit for fabric imports and containerlab files"
    )
    node_name: str | None = Field(None, description="the node a programmer agent runs on")
    upstreams: str = Field(
        "",
        description="entry point: the services behind it, as name=URL pairs, comma-separated "
        "(topology=http://127.0.0.1:8081,health=...); a name given again adds a replica "
        "(topology=http://a:8080,topology=http://b:8080)",
    )
    dashboard_dir: Path | None = Field(
        None,
        description="entry point: the built dashboard (index.html, assets/, swagger/); "
        "default: services/gateway/dashboard/dist beside the gateway package",
    )
    lab: str | None = Field(
        None, description="programmer: run an agent for every node of this fabric lab (prefix)"
    )
    emulated_fabric: bool = Field(
        True, description="thorn-run: build the fabric as a lab and program it (needs root)"
    )
    topology_replicas: int = Field(
        1, ge=1, le=9, description="thorn-run: topology processes behind the entry point"
    )
    health_replicas: int = Field(
        1, ge=1, le=9,
        description="thorn-run: health processes (one takes agents' reports, the others stand "
        "by and serve reads)",
    )  # fmt: skip
    pathcomp_replicas: int = Field(
        1, ge=1, le=9,
        description="thorn-run: pathcomp processes (each plans; the elected leader writes "
        "desired state; 2 for a standby that takes over)",
    )  # fmt: skip
    start_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="how long a service may take to answer /healthz when thorn-run starts it, "
        "and the programmer's BFD child to start (raise it on slow or emulated machines)",
    )
    lab_agents: Literal["per-node", "one"] = Field(
        "one",
        description="thorn-run: one programmer process for the whole lab, or one per lab node "
        "(as production runs it; on a 2-core machine the 22 processes slow each other: "
        "docs/benchmarks.md)",
    )
    datapath: Literal["auto", "flower", "emulation"] = Field(
        "auto",
        description="programmer: host datapath driver; auto picks flower if the kernel has it",
    )
    stage_ack_seconds: float = Field(
        2.0, gt=0, le=60, description="pathcomp: longest wait for agents to apply one stage"
    )
    lease_seconds: float = Field(
        3.0, gt=0.1, le=60, description="leader lease of replicated services (pathcomp)"
    )
    report_seconds: float = Field(
        5.0, gt=0, le=300,
        description="programmer: seconds between full port reports (carrier and counters)",
    )  # fmt: skip
    register_seconds: float = Field(
        30.0, gt=0, le=3600,
        description="programmer: longest time between registrations with topology (what the "
        "agent observes; a change is registered within a few seconds)",
    )  # fmt: skip
    neighbour_probe_seconds: float = Field(
        1.0, ge=0.1, le=60,
        description="programmer: seconds between LLDP neighbour probes out of each fabric "
        "port (a neighbour is forgotten after 4 missed probes)",
    )  # fmt: skip
    bfd_sessions: Literal["off", "links", "peers", "all"] = Field(
        "all",
        description="programmer: BFD on fabric links (single-hop), toward peer TEPs per "
        "colour (multihop, drives the local failover), both, or none",
    )
    bfd_interval_ms: int = Field(
        50, ge=10, le=10_000, description="programmer: BFD desired TX and required RX interval"
    )
    bfd_multiplier: int = Field(3, ge=1, le=255, description="programmer: BFD detect multiplier")
    bfd_peers: Annotated[int, Field(ge=0, le=100_000)] | Literal["all"] = Field(
        8,
        description="programmer: peer hosts a host runs multihop BFD toward (2 sessions each); "
        "all: every peer in its VNIs (a full mesh)",
    )  # fmt: skip
    bfd_auth_file: Path | None = Field(
        None,
        description="programmer: BFD authentication rules and keys (TOML, docs/bfd.md "
        "'Authentication'); re-read when it changes; unset: no session authenticates",
    )
    failover_revertive: bool = Field(
        True,
        description="programmer: after a flip, move back to the preferred colour once it is "
        "safe again (re-protected, or its BFD session Up) for the hold-down",
    )
    failover_hold_down_ms: int = Field(
        2000, ge=0, le=3_600_000,
        description="programmer: how long the preferred colour must stay safe before a "
        "revertive agent moves back to it",
    )  # fmt: skip
    link_up_hold_ms: int = Field(
        1000, ge=0, le=3_600_000,
        description="health and programmer: how long a link that went down must be up again "
        "(carrier and BFD) before it carries traffic: health returns it to service, a switch "
        "puts back the primaries its BFD Down withdrew",
    )  # fmt: skip
    health_degraded_loss: float = Field(
        0.01, ge=0, le=1, description="health: loss fraction above which a link is degraded"
    )
    health_min_packets: int = Field(
        100, ge=1, description="health: fewest packets between counter reports to judge loss"
    )
    health_flap_penalty: float = Field(
        1000.0, gt=0, description="health: dampening penalty per flap (RFC 2439)"
    )
    health_half_life_seconds: float = Field(
        15.0, gt=0, le=3600, description="health: dampening half-life of the figure of merit"
    )
    health_suppress_at: float = Field(
        2000.0, gt=0, description="health: figure of merit at which a link is flapping"
    )
    health_reuse_at: float = Field(
        750.0, gt=0, description="health: figure of merit below which it is reused"
    )
    health_max_penalty: float = Field(
        6000.0, gt=0, description="health: ceiling of the figure of merit"
    )
    health_max_items: int = Field(
        1000, ge=1, le=1000, description="health: most items it accepts in one agent report"
    )

    @field_validator("nats_ca", "nats_cert", "nats_key", "tls_cert", "tls_key", "tls_ca",
                     "nats_creds", "nats_issuer_seed", mode="before")  # fmt: skip
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # Set but empty (a compose ${VAR:-}) is unset, not the current directory.
        return None if value == "" else value

    @field_validator("admin_token")
    @classmethod
    def _token_shaped(cls, value: SecretStr | None) -> SecretStr | None:
        # Any other shape is refused unseen by the API (401), so it could never be used.
        if value is not None and not TOKEN_PATTERN.fullmatch(value.get_secret_value()):
            raise ValueError(f"must be {TOKEN_FORMAT}")
        return value

    @field_validator("trusted_proxies", "gateway_trusted_proxies")
    @classmethod
    def _networks(cls, value: str) -> str:
        """Addresses and networks (or *: any), normalised: 10.1.2.3/16 becomes 10.1.0.0/16."""
        items = []
        for item in filter(None, (part.strip() for part in value.split(","))):
            try:
                items.append(item if item == "*" else
                             str(ipaddress.ip_network(item, strict=False)) if "/" in item else
                             str(ipaddress.ip_address(item)))  # fmt: skip
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network") from None
        return ",".join(items)

    @classmethod
    def from_environment(cls, program: str, arguments: list[str] | None = None) -> Settings:
        """The settings; a bad one ends the process with one line per variable at fault
        (`program: THORN_X: what is wrong`, never its value) and exit 78 (EX_CONFIG).
        The programs take no arguments: `--help` lists the variables, anything else is a
        usage error (exit 2) rather than a controller started with it ignored."""
        cls._no_arguments(program, sys.argv[1:] if arguments is None else arguments)
        try:
            return cls()
        except ValidationError as exc:
            for error in exc.errors(include_url=False, include_input=False):
                name = f"THORN_{str(error['loc'][0]).upper()}" if error["loc"] else "settings"
                reason = str(error["msg"]).removeprefix("Value error, ")
                print(f"{program}: {name}: {reason}", file=sys.stderr)
            raise SystemExit(os.EX_CONFIG) from None

    @classmethod
    def _no_arguments(cls, program: str, arguments: list[str]) -> None:
        if not arguments:
            return
        if arguments[0] in ("-h", "--help"):
            print(f"usage: {program}\n\nNo arguments: settings are environment variables "
                  "(docs/operations.md has the whole reference):\n")  # fmt: skip
            for name, info in cls.model_fields.items():
                print(f"  THORN_{name.upper():<30} {info.description or ''}".rstrip())
            raise SystemExit(0)
        given = " ".join(arguments)
        print(f"{program}: takes no arguments (got {given!r}); settings are THORN_* "
              f"environment variables: {program} --help lists them", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)

    @classmethod
    def unknown_environment(cls) -> list[str]:
        """THORN_* variables no setting reads: most likely typos an admin wants to hear of."""
        known = {f"THORN_{name.upper()}" for name in cls.model_fields}
        return sorted(k for k in os.environ if k.startswith("THORN_") and k not in known)

    @property
    def db_url(self) -> str:
        # Set but empty is a mistake to report, not a request for SQLite.
        if self.database_url is not None:
            return self.database_url
        return sqlite_url(self.data_dir.resolve())

    @property
    def db_variable(self) -> str:
        """The setting a database problem at start is the fault of."""
        return "THORN_DATABASE_URL" if self.database_url is not None else "THORN_DATA_DIR"

    @property
    def db_pool(self) -> PoolSettings:
        return PoolSettings(
            size=self.db_pool_size,
            max_overflow=self.db_max_overflow,
            timeout_s=self.db_pool_timeout_s,
            recycle_s=self.db_pool_recycle_s,
            statement_timeout_ms=self.db_statement_timeout_ms,
            connect_timeout_s=self.db_connect_timeout_s,
        )

    @property
    def upstream_urls(self) -> dict[str, tuple[str, ...]]:
        """THORN_UPSTREAMS as service name -> its replicas' base URLs, in the order given;
        ValueError naming the variable."""
        out: dict[str, tuple[str, ...]] = {}
        for pair in filter(None, (p.strip() for p in self.upstreams.split(","))):
            name, sep, url = pair.partition("=")
            if not sep or not name.strip() or not url.strip().startswith(("http://", "https://")):
                raise ValueError(f"THORN_UPSTREAMS: expected name=http://host:port, got '{pair}'")
            base = url.strip().rstrip("/")
            if base in out.get(name.strip(), ()):
                raise ValueError(f"THORN_UPSTREAMS: {name.strip()}={base} is given twice")
            out[name.strip()] = (*out.get(name.strip(), ()), base)
        return out

    @property
    def https(self) -> ServerFiles | None:
        """THORN_TLS_CERT and THORN_TLS_KEY, checked (TlsSettingError naming the one at fault);
        None: plain HTTP."""
        return server_files(self.tls_cert, self.tls_key)

    @property
    def nats_tls(self) -> ssl.SSLContext | None:
        """The NATS client's TLS context from THORN_NATS_CA (and THORN_NATS_CERT/KEY), checked
        (TlsSettingError naming the setting at fault); None: plain NATS."""
        if self.nats_ca is None and self.nats_cert is None and self.nats_key is None:
            return None
        return client_context(self.nats_ca, ca_variable="THORN_NATS_CA", cert=self.nats_cert,
                              key=self.nats_key, cert_variable="THORN_NATS_CERT",
                              key_variable="THORN_NATS_KEY")  # fmt: skip

    @property
    def upstream_tls(self) -> ssl.SSLContext:
        """What the entry point verifies https:// upstreams with: THORN_TLS_CA, else the
        system's CAs (TlsSettingError naming THORN_TLS_CA)."""
        return client_context(self.tls_ca, ca_variable="THORN_TLS_CA")

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host or "127.0.0.1", int(port)
