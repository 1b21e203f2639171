"""The pure rules of authentication: a token's shape, when a found token is refused, how often
a token's last use is written, what a request leaves in the audit log, and the entry point's
limit on failed authentications per client (a fake clock throughout)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from thorn.audit import AuditNote, AuditWriter, entry_for
from thorn.auth import TokenUsage, new_token, refusal, well_formed
from thorn.model import TokenRole
from thorn.store.tokens import AuditRecord, TokenRecord
from thorn_gateway.limiter import FailureLimiter, client_address, client_key, parse_networks

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


# --- the token's shape -----------------------------------------------------------------------


def test_a_made_token_is_well_formed() -> None:
    assert all(well_formed(new_token()) for _ in range(200))


@pytest.mark.parametrize(
    "secret",
    [
        "",
        "thn_",
        "thn_" + "a" * 42,  # one short
        "thn_" + "a" * 44,  # one long
        "THN_" + "a" * 43,  # the prefix is lower case
        "xyz_" + "a" * 43,
        "thn_" + "a" * 42 + "=",  # base64 padding is not in the alphabet
        "thn_" + "a" * 42 + "+",  # nor standard base64's '+' and '/'
        "thn_" + "a" * 42 + "/",
        "thn_" + "a" * 42 + "é",
        "thn_" + "a" * 43 + "\n",
        " thn_" + "a" * 43,
    ],
)
def test_any_other_shape_is_malformed(secret: str) -> None:
    assert not well_formed(secret)


# --- when a found token is refused -----------------------------------------------------------


def test_an_unknown_digest_is_refused_as_unknown() -> None:
    assert refusal(None, NOW) == ("unknown", "invalid or revoked token")


def test_a_token_without_expiry_is_accepted() -> None:
    assert refusal(TokenRecord("ci", TokenRole.viewer), NOW) is None


def test_a_token_is_accepted_until_its_expiry_and_refused_from_then_on() -> None:
    token = TokenRecord("ci", TokenRole.viewer, expires_at=NOW)
    assert refusal(token, NOW - timedelta(microseconds=1)) is None
    reason, message = refusal(token, NOW) or ("", "")
    assert reason == "expired" and message == f"token 'ci' expired at {NOW.isoformat()}"


def test_an_old_secret_works_until_its_overlap_ends_then_says_it_was_rotated() -> None:
    old = TokenRecord("ci", TokenRole.viewer, old_secret=True, old_until=NOW)
    assert refusal(old, NOW - timedelta(seconds=1)) is None
    reason, message = refusal(old, NOW) or ("", "")
    assert reason == "rotated" and "token 'ci' was rotated" in message and "new secret" in message


def test_an_old_secret_of_an_expired_token_is_refused_as_expired() -> None:
    old = TokenRecord("ci", TokenRole.viewer, expires_at=NOW, old_secret=True,
                      old_until=NOW + HOUR)  # fmt: skip
    assert (refusal(old, NOW) or ("", ""))[0] == "expired"


# --- last use: written at most once a minute per token ---------------------------------------


def test_a_token_s_use_is_noted_at_most_once_a_minute() -> None:
    usage = TokenUsage(every_s=60)
    usage.seen("ci", NOW)
    usage.seen("ci", NOW + timedelta(seconds=59))
    usage.seen("grafana", NOW + timedelta(seconds=10))
    assert usage.take() == {"ci": NOW, "grafana": NOW + timedelta(seconds=10)}
    usage.seen("ci", NOW + timedelta(seconds=59.9))
    assert usage.take() == {}
    usage.seen("ci", NOW + timedelta(seconds=60))
    assert usage.take() == {"ci": NOW + timedelta(seconds=60)}


def test_uses_a_failed_write_could_not_record_are_kept_unless_a_later_one_came() -> None:
    usage = TokenUsage(every_s=60)
    usage.seen("ci", NOW)
    usage.seen("grafana", NOW)
    taken = usage.take()
    usage.seen("ci", NOW + HOUR)
    usage.put_back(taken)
    assert usage.take() == {"ci": NOW + HOUR, "grafana": NOW}


# --- what a request leaves in the audit log --------------------------------------------------


def _entry(
    method: str, status: int, note: AuditNote, error: str | None = None
) -> AuditRecord | None:
    return entry_for(method, "/api/v1/nodes/leaf1", "/api/v1/nodes/{name}", status, note,
                     client="192.0.2.7", at=NOW, error=error)  # fmt: skip


def test_a_refused_authentication_leaves_a_denied_entry_on_any_method() -> None:
    for method in ("GET", "POST"):
        entry = _entry(method, 401, AuditNote(denied="malformed"))
        assert entry is not None
        assert (entry.action, entry.actor, entry.outcome, entry.client, entry.target) == (
            "auth.failure", "anonymous", "denied", "192.0.2.7", f"{method} /api/v1/nodes/leaf1",
        )  # fmt: skip
        assert entry.detail == {"reason": "malformed", "status": 401}


def test_a_role_refusal_names_the_token() -> None:
    entry = _entry("DELETE", 403, AuditNote(actor="grafana", denied="forbidden"))
    assert entry is not None
    assert (entry.action, entry.actor, entry.outcome) == ("auth.forbidden", "grafana", "denied")


def test_a_read_leaves_nothing_and_a_write_the_store_recorded_leaves_nothing_more() -> None:
    assert _entry("GET", 200, AuditNote(actor="ci")) is None
    assert _entry("GET", 404, AuditNote(actor="ci")) is None
    assert _entry("PATCH", 200, AuditNote(actor="ci", recorded=True)) is None


def test_a_write_the_store_did_not_record_leaves_its_outcome() -> None:
    note = AuditNote(actor="ci", action="node.update", target="leaf1")
    cases = {200: "ok", 409: "refused", 422: "refused", 404: "refused", 503: "failed",
             500: "failed"}  # fmt: skip
    for status, outcome in cases.items():
        entry = _entry("PATCH", status, note, error="body.role: wrong" if status >= 400 else None)
        assert entry is not None
        assert (entry.action, entry.target, entry.actor, entry.outcome) == (
            "node.update", "leaf1", "ci", outcome,
        )  # fmt: skip
        assert entry.detail["status"] == status
        assert ("error" in entry.detail) == (status >= 400)


def test_a_write_no_handler_named_is_named_by_its_method_and_route() -> None:
    entry = _entry("POST", 200, AuditNote(actor="ci"))
    assert entry is not None
    assert (entry.action, entry.target) == ("POST /api/v1/nodes/{name}", "/api/v1/nodes/leaf1")


# --- the entry point: who the client is ------------------------------------------------------


def test_a_peer_that_is_not_a_trusted_proxy_is_the_client_whatever_it_forwards() -> None:
    assert client_address("192.0.2.7", ["203.0.113.9"], []) == "192.0.2.7"
    proxies = parse_networks("10.0.0.0/8", "X")
    assert client_address("192.0.2.7", ["203.0.113.9, 10.0.0.1"], proxies) == "192.0.2.7"


def test_a_trusted_proxy_names_the_rightmost_address_that_is_not_a_trusted_proxy() -> None:
    proxies = parse_networks("10.0.0.0/8, 2001:db8::1", "X")
    # The client put 198.51.100.1 first to pose as it; the load balancer appended the truth.
    chain = ["198.51.100.1, 203.0.113.9", "10.1.1.1"]
    assert client_address("10.0.0.5", chain, proxies) == "203.0.113.9"
    assert client_address("2001:db8::1", ["203.0.113.9"], proxies) == "203.0.113.9"
    assert client_address("10.0.0.5", [], proxies) == "10.0.0.5"  # sent nothing: the proxy
    assert client_address("10.0.0.5", ["10.0.0.6"], proxies) == "10.0.0.6"  # all trusted
    assert client_address("10.0.0.5", ["nonsense, 10.0.0.6"], proxies) == "10.0.0.6"


def test_ipv4_mapped_addresses_count_as_ipv4() -> None:
    assert client_address("::ffff:192.0.2.7", [], []) == "192.0.2.7"


def test_failures_count_per_ipv4_address_and_per_ipv6_64() -> None:
    assert client_key("192.0.2.7") == "192.0.2.7"
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9")
    assert client_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")


def test_a_trusted_proxy_list_names_its_variable_when_it_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"THORN_GATEWAY_TRUSTED_PROXIES: 'lb\.example' is not"):
        parse_networks("10.0.0.1, lb.example", "THORN_GATEWAY_TRUSTED_PROXIES")


# --- the entry point: the limit on failed authentications ------------------------------------


def test_a_client_at_the_limit_waits_until_its_oldest_failure_leaves_the_window() -> None:
    limiter = FailureLimiter(limit=3, window_s=60)
    assert not limiter.failed("a", 0.0)
    assert not limiter.failed("a", 10.0)
    assert limiter.retry_after("a", 10.0) is None
    assert limiter.failed("a", 20.0)  # the third within 60 s
    assert limiter.retry_after("a", 20.0) == 40
    assert limiter.retry_after("a", 59.5) == 1  # whole seconds, rounded up
    assert limiter.retry_after("a", 60.0) is None  # the first failure has left the window
    assert limiter.failed("a", 61.0)  # ... but one more failure fills it again
    assert limiter.retry_after("a", 61.0) == 9


def test_one_client_s_failures_never_hold_back_another() -> None:
    limiter = FailureLimiter(limit=2, window_s=60)
    limiter.failed("a", 0.0)
    limiter.failed("a", 1.0)
    assert limiter.retry_after("a", 2.0) == 58
    assert limiter.retry_after("b", 2.0) is None


def test_failures_spread_wider_than_the_window_never_reach_the_limit() -> None:
    limiter = FailureLimiter(limit=3, window_s=60)
    assert not any(limiter.failed("a", t * 31.0) for t in range(100))


def test_the_least_recent_clients_are_forgotten_first_beyond_the_bound() -> None:
    limiter = FailureLimiter(limit=1, window_s=60, max_clients=2)
    for key in ("a", "b", "c"):
        limiter.failed(key, 0.0)
    assert limiter.clients == 2
    assert limiter.retry_after("a", 1.0) is None
    assert limiter.retry_after("c", 1.0) == 59


# --- the audit writer's queue ----------------------------------------------------------------


class _Table:
    """Stands in for the store's audit table: what `append_audit` was given, and whether it
    fails (the database away)."""

    def __init__(self) -> None:
        self.rows: list[AuditRecord] = []
        self.failing = False

    async def append_audit(self, records: list[AuditRecord]) -> None:
        if self.failing:
            raise ConnectionError("the database is away")
        self.rows.extend(records)


def _denied(n: int) -> AuditRecord:
    return AuditRecord(at=NOW, actor="anonymous", action="auth.failure", target=f"GET /{n}",
                       outcome="denied", client="192.0.2.7")  # fmt: skip


async def test_beyond_its_bound_the_queue_counts_entries_into_one_summary() -> None:
    table = _Table()
    writer = AuditWriter(table, max_pending=3, clock=lambda: NOW)  # type: ignore[arg-type]
    for n in range(5):
        writer.add(_denied(n))
    assert writer.pending == 5
    await writer.flush()
    assert [r.target for r in table.rows] == ["GET /0", "GET /1", "GET /2", "(queue full)"]
    summary = table.rows[-1]
    assert (summary.actor, summary.action, summary.outcome, summary.client) == (
        "audit", "auth.failure", "denied", "192.0.2.7",
    )  # fmt: skip
    assert summary.detail == {"count": 2, "summarised": True}
    assert writer.pending == 0


async def test_entries_a_failed_write_could_not_store_are_written_once_later() -> None:
    table = _Table()
    writer = AuditWriter(table, clock=lambda: NOW)  # type: ignore[arg-type]
    writer.add(_denied(1))
    table.failing = True
    with pytest.raises(ConnectionError):
        await writer.flush()
    assert writer.pending == 1 and table.rows == []
    table.failing = False
    writer.add(_denied(2))
    await asyncio.gather(writer.flush(), writer.flush())  # two flushes at once write each once
    assert [r.target for r in table.rows] == ["GET /1", "GET /2"]
