"""THORN's NATS identities, pure: JWT signing and reading, creds files, each role's
permissions, and what the issuer checks before renewing an agent's credentials. (The server
enforcing them: tests/integration/test_nats_permissions.py.)"""

from __future__ import annotations

import base64
import json

import pytest

from thorn.events import subject_matches
from thorn.natsauth import permissions
from thorn.natsauth.issue import (
    AGENT_LIFETIME,
    Trust,
    account_jwt,
    check_issued,
    new_trust,
    operator_jwt,
    renew_at,
    server_config,
    user_creds,
    user_jwt,
    vnis_of,
)
from thorn.natsauth.jwt import (
    JwtError,
    creds,
    decode,
    encode,
    key_from_seed,
    kind_of,
    new_key,
    read_creds,
)

NOW = 1_800_000_000.0
KV_CREATE = "$JS.API.CONSUMER.CREATE.KV_thorn-desired-state"


def allowed(patterns: tuple[str, ...], subject: str) -> bool:
    return any(subject_matches(p, subject) for p in patterns)


# --- keys and tokens -------------------------------------------------------------------------


def test_a_new_key_is_of_its_kind_and_its_seed_gives_it_back() -> None:
    for kind, letter in (("operator", "O"), ("account", "A"), ("user", "U")):
        key = new_key(kind)  # type: ignore[arg-type]
        assert key.public.startswith(letter) and key.seed.startswith("S")
        assert kind_of(key.public) == kind
        assert key_from_seed(key.seed) == key


def test_a_key_never_shows_its_seed_when_printed() -> None:
    key = new_key("user")
    assert key.seed not in repr(key) and key.public in repr(key)


def test_a_public_key_with_a_wrong_checksum_is_refused() -> None:
    public = new_key("user").public
    broken = public[:-1] + ("A" if public[-1] != "A" else "B")
    with pytest.raises(JwtError):
        kind_of(broken)


def test_a_signed_token_decodes_to_what_was_signed() -> None:
    account, user = new_key("account"), new_key("user")
    token = encode("user", user.public, "agent:leaf1", {"pub": {"allow": ["a"]}}, account,
                   now=NOW, expires=NOW + 60)  # fmt: skip
    claims = decode(token, trusted=(account.public,))
    assert (claims.subject, claims.issuer, claims.name) == (user.public, account.public,
                                                             "agent:leaf1")  # fmt: skip
    assert claims.type == "user" and claims.nats["version"] == 2
    assert claims.nats["pub"] == {"allow": ["a"]}
    assert claims.expires == int(NOW + 60) and claims.issued_at == int(NOW)
    assert not claims.expired(NOW + 60) and claims.expired(NOW + 61)


def test_a_token_whose_claims_were_changed_does_not_verify() -> None:
    account, user = new_key("account"), new_key("user")
    header, body, signature = encode("user", user.public, "x", {}, account, now=NOW).split(".")
    claims = json.loads(_unb64(body))
    claims["nats"]["pub"] = {"allow": [">"]}
    forged = ".".join([header, _b64(json.dumps(claims).encode()), signature])
    with pytest.raises(JwtError, match="signature"):
        decode(forged)


def test_a_token_from_an_untrusted_issuer_is_refused() -> None:
    token = encode("user", new_key("user").public, "x", {}, new_key("account"), now=NOW)
    with pytest.raises(JwtError, match="trust"):
        decode(token, trusted=(new_key("account").public,))


def test_only_an_account_key_signs_a_user_and_a_subject_is_of_the_token_s_kind() -> None:
    with pytest.raises(JwtError, match="cannot sign"):
        encode("user", new_key("user").public, "x", {}, new_key("operator"), now=NOW)
    with pytest.raises(JwtError, match="subject"):
        encode("user", new_key("account").public, "x", {}, new_key("account"), now=NOW)


def test_a_creds_file_holds_the_token_and_the_user_seed() -> None:
    user = new_key("user")
    token = encode("user", user.public, "x", {}, new_key("account"), now=NOW)
    text = creds(token, user)
    assert "BEGIN NATS USER JWT" in text and "BEGIN USER NKEY SEED" in text
    assert read_creds(text) == (token, user)


def test_a_creds_file_without_its_seed_says_what_is_missing() -> None:
    user = new_key("user")
    text = creds(encode("user", user.public, "x", {}, new_key("account"), now=NOW), user)
    with pytest.raises(JwtError, match="user seed"):
        read_creds(text.split("-----BEGIN USER NKEY SEED")[0])


# --- permissions ------------------------------------------------------------------------------


def test_an_agent_publishes_only_its_own_reports_acks_registrations_and_failovers() -> None:
    mine = permissions.agent("leaf1", [100])
    for subject in ("agent.report.leaf1", "agent.applied.leaf1", "agent.register.leaf1",
                    "failover.leaf1", "agent.renew.leaf1"):  # fmt: skip
        assert allowed(mine.publish, subject), subject
    for subject in ("agent.report.leaf2", "agent.applied.leaf2", "failover.leaf2",
                    "health.link.1", "topology.changed", "paths.changed", "agent.flip.leaf1",
                    "$KV.thorn-desired-state.node.leaf1", "$KV.thorn-leases.pathcomp"):  # fmt: skip
        assert not allowed(mine.publish, subject), subject


def test_an_agent_may_create_watches_on_its_key_and_its_vnis_only() -> None:
    mine = permissions.agent("host1", [100, 200])
    ok = [f"{KV_CREATE}.w1.$KV.thorn-desired-state.node.host1",
          f"{KV_CREATE}.w1.$KV.thorn-desired-state.vni.100.*",
          f"{KV_CREATE}.w1.$KV.thorn-desired-state.vni.200.3"]  # fmt: skip
    refused = [KV_CREATE, f"{KV_CREATE}.w1",
               f"{KV_CREATE}.w1.$KV.thorn-desired-state.>",
               f"{KV_CREATE}.w1.$KV.thorn-desired-state.node.host2",
               f"{KV_CREATE}.w1.$KV.thorn-desired-state.node.host1.x",
               f"{KV_CREATE}.w1.$KV.thorn-desired-state.vni.300.*",
               f"{KV_CREATE}.w1.$KV.thorn-desired-state.vni.10.*",
               "$JS.API.STREAM.MSG.GET.KV_thorn-desired-state",
               "$JS.API.CONSUMER.DURABLE.CREATE.KV_thorn-desired-state.w1",
               "$JS.API.STREAM.DELETE.KV_thorn-desired-state"]  # fmt: skip
    assert all(allowed(mine.publish, s) for s in ok)
    assert not any(allowed(mine.publish, s) for s in refused)


def test_an_agent_subscribes_to_its_commands_and_its_own_inbox_only() -> None:
    mine = permissions.agent("host1")
    assert allowed(mine.subscribe, "agent.flip.host1")
    assert allowed(mine.subscribe, "agent.creds.host1")
    assert allowed(mine.subscribe, f"{mine.inbox}.abc.1")
    for subject in ("agent.flip.host2", "_INBOX.x", "_I.agent.host2.x", "_I.topology.x",
                    "agent.report.host2", ">"):  # fmt: skip
        assert not allowed(mine.subscribe, subject), subject


def test_inboxes_are_one_token_per_name_and_kept_apart_by_role() -> None:
    assert permissions.inbox_prefix("agent", "a.b") == "_I.agent.a~b"
    node_a = permissions.agent("a")
    assert not allowed(node_a.subscribe, f"{permissions.inbox_prefix('agent', 'a.b')}.x")
    assert permissions.agent("topology").inbox != permissions.topology().inbox


def test_health_publishes_link_health_and_nothing_agents_say() -> None:
    health = permissions.health()
    assert allowed(health.publish, "health.link.7")
    assert allowed(health.subscribe, "agent.report.leaf1") and health.respond
    for subject in ("agent.report.leaf1", "topology.changed", "$KV.thorn-desired-state.node.x",
                    "agent.flip.host1", "$KV.thorn-leases.pathcomp"):  # fmt: skip
        assert not allowed(health.publish, subject), subject
    assert allowed(health.publish, "$KV.thorn-leases.health")


def test_pathcomp_writes_desired_state_and_flips_but_not_link_health() -> None:
    pathcomp = permissions.pathcomp()
    for subject in ("$KV.thorn-desired-state.node.leaf1", "agent.flip.host1",
                    "paths.changed", "failover.pathcomp", "$KV.thorn-leases.pathcomp"):  # fmt: skip
        assert allowed(pathcomp.publish, subject), subject
    for subject in ("health.link.1", "topology.changed", "failover.host1",
                    "$KV.thorn-leases.health", "$JS.API.STREAM.DELETE.THORN_PATHS"):  # fmt: skip
        assert not allowed(pathcomp.publish, subject), subject


def test_topology_announces_changes_and_pushes_credentials() -> None:
    topology = permissions.topology()
    assert allowed(topology.publish, "topology.changed")
    assert allowed(topology.publish, "agent.creds.host1")
    assert allowed(topology.subscribe, "agent.renew.host1") and topology.respond
    assert not allowed(topology.publish, "health.link.1")
    assert not allowed(topology.publish, "$KV.thorn-desired-state.node.leaf1")


def test_no_service_may_delete_or_purge_a_stream() -> None:
    for role in permissions.SERVICES:
        held = permissions.service(role).publish
        for verb in ("DELETE", "PURGE"):
            assert not allowed(held, f"$JS.API.STREAM.{verb}.THORN_TOPOLOGY"), (role, verb)


def test_every_role_has_allow_lists_an_empty_one_would_allow_everything() -> None:
    for held in [permissions.agent("n"), *map(permissions.service, permissions.SERVICES)]:
        assert held.publish and held.subscribe


# --- issuing ----------------------------------------------------------------------------------


def trust() -> Trust:
    return new_trust()


def test_a_user_jwt_is_signed_by_the_signing_key_on_behalf_of_the_account() -> None:
    t = trust()
    user = new_key("user")
    token = user_jwt(
        permissions.agent("leaf1"), user.public, t.signer, now=NOW, lifetime=AGENT_LIFETIME
    )
    claims = decode(token, trusted=(t.issuer.public,))
    assert claims.nats["issuer_account"] == t.account.public
    assert claims.expires == int(NOW + AGENT_LIFETIME)
    assert claims.nats["pub"]["allow"] == list(permissions.agent("leaf1").publish)


def test_the_account_lists_its_signing_keys_and_has_jetstream() -> None:
    t = trust()
    claims = decode(account_jwt(t, now=NOW), trusted=(t.operator.public,))
    assert claims.nats["signing_keys"] == [t.issuer.public]
    assert claims.nats["limits"]["disk_storage"] == -1  # JetStream on, unlimited
    operator = decode(operator_jwt(t, now=NOW))
    assert operator.nats["system_account"] == t.system.public


def test_the_server_config_preloads_both_accounts() -> None:
    t = trust()
    text = server_config(t, now=NOW)
    assert "resolver: MEMORY" in text and f"system_account: {t.system.public}" in text
    assert f"  {t.system.public}: " in text and f"  {t.account.public}: " in text
    assert t.operator.seed not in text and t.issuer.seed not in text


def test_a_revoked_key_appears_in_the_account_jwt() -> None:
    t = trust()
    user = new_key("user")
    revoked = Trust(t.operator, t.system, t.account, t.signing_keys, {user.public: int(NOW)})
    claims = decode(account_jwt(revoked, now=NOW))
    assert claims.nats["revocations"] == {user.public: int(NOW)}


def test_renewal_accepts_the_agent_s_own_jwt_and_reads_its_vnis() -> None:
    t = trust()
    user = new_key("user")
    token = user_jwt(
        permissions.agent("host1", [5, 7]), user.public, t.signer, now=NOW, lifetime=100
    )
    claims = check_issued(token, t.signer, node="host1")
    assert claims.subject == user.public
    assert vnis_of(claims) == {5, 7}
    assert renew_at(claims) == int(NOW) + 50


def test_renewal_refuses_another_node_s_a_foreign_or_a_revoked_jwt() -> None:
    t = trust()
    user = new_key("user")
    token = user_jwt(permissions.agent("host1"), user.public, t.signer, now=NOW, lifetime=100)
    with pytest.raises(JwtError, match="host2"):
        check_issued(token, t.signer, node="host2")
    with pytest.raises(JwtError, match="trust"):
        check_issued(token, trust().signer, node="host1")
    revoked = Trust(t.operator, t.system, t.account, t.signing_keys, {user.public: int(NOW)})
    with pytest.raises(JwtError, match="revoked"):
        check_issued(token, revoked.signer, node="host1")


def test_a_second_signing_key_keeps_older_users_valid_while_rotating() -> None:
    t = trust()
    old_user = decode(user_creds_token(t))
    rotated = Trust(t.operator, t.system, t.account, (new_key("account"), t.issuer))
    assert decode(account_jwt(rotated, now=NOW)).nats["signing_keys"] == [
        rotated.issuer.public,
        t.issuer.public,
    ]
    assert old_user.issuer in {k.public for k in rotated.signing_keys}


def user_creds_token(t: Trust) -> str:
    token, _ = read_creds(user_creds(permissions.health(), t, now=NOW, lifetime=None))
    return token


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
