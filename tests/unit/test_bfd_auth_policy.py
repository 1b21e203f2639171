"""Which BFD sessions authenticate and with which keys: the agent's THORN_BFD_AUTH_FILE (TOML
rules, first match wins), its errors (naming the rule and field, never a secret), its
re-reading when it changes, and the agent's sessions taking new keys in place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from thorn.config import Settings
from thorn_programmer.app import ConfigurationError, open_bfd_auth
from thorn_programmer.bfd import AuthKey, AuthType, BfdAuth, SessionConfig
from thorn_programmer.bfd.policy import (
    AuthFile,
    AuthPolicy,
    AuthPolicyError,
    parse_policy,
    readable_by_others,
)
from thorn_programmer.detect import BfdSessions, Discriminators
from thorn_programmer.intent import HostIntent, UnderlayRoute

RULES = """
[[rule]]
nodes = ["leaf9"]
type = "none"

[[rule]]
ports = ["eth0"]
multihop = false
type = "meticulous-keyed-sha1"
send_key = 2
keys = [
  { id = 1, secret = "link-old" },
  { id = 2, secret_hex = "00ff10" },
]

[[rule]]
peers = ["10.224.0.0/16", "10.240.0.7"]
type = "keyed-sha1"
keys = [{ id = 7, secret = "peers" }]
"""


def test_the_first_rule_that_fits_a_session_decides() -> None:
    policy = parse_policy(RULES)
    link = policy.for_session("leaf1", "10.0.0.1", "eth0", False)
    assert link == BfdAuth(
        AuthType.METICULOUS_KEYED_SHA1, (AuthKey(1, b"link-old"), AuthKey(2, b"\x00\xff\x10")), 2
    )
    assert policy.for_session("leaf9", "10.0.0.1", "eth0", False) is None  # rule 1: none
    peer = policy.for_session("host1", "10.224.3.4", None, True)
    assert peer == BfdAuth(AuthType.KEYED_SHA1, (AuthKey(7, b"peers"),), 7)
    assert policy.for_session("host1", "10.240.0.7", None, True) == peer  # one address
    assert policy.for_session("host1", "10.240.0.8", None, True) is None  # no rule fits
    assert policy.for_session("leaf1", "10.0.0.1", "eth1", False) is None


def test_an_empty_file_authenticates_nothing() -> None:
    assert parse_policy("") == AuthPolicy()
    assert parse_policy("").for_session("n", "10.0.0.1", "eth0", False) is None


def test_the_rules_describe_themselves_without_secrets() -> None:
    lines = parse_policy(RULES).describe()
    assert lines == [
        "rule 1: nodes leaf9: none",
        "rule 2: ports eth0; single hop: meticulous-keyed-sha1, sends key 2, accepts 1, 2",
        "rule 3: peers 10.224.0.0/16, 10.240.0.7/32: keyed-sha1, sends key 7, accepts 7",
    ]


def rule(**fields: Any) -> str:
    def toml(value: Any) -> str:
        if isinstance(value, str):
            return f'"{value}"'
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, list):
            return "[" + ", ".join(toml(v) for v in value) + "]"
        if isinstance(value, dict):
            return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }"
        return str(value)

    return "[[rule]]\n" + "".join(f"{k} = {toml(v)}\n" for k, v in fields.items())


LONG_SECRET = "this-secret-is-far-too-long"  # 27 bytes
SHA1 = "keyed-sha1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (rule(type=SHA1, keys=[{"id": 1, "secret": LONG_SECRET}]),
         "rule 1, keys 1: the secret is 27 bytes; keyed SHA1 takes 1 to 20"),
        (rule(type=SHA1, keys=[{"id": 1, "secret": "a", "secret_hex": "00"}]),
         "rule 1, keys 1: give exactly one of secret and secret_hex"),
        (rule(type=SHA1, keys=[{"id": 1, "secret_hex": "zz-not-hex"}]),
         "rule 1, keys 1: secret_hex is not hexadecimal"),
        (rule(type=SHA1, keys=[{"id": 1, "secrets": "typo"}]),
         "rule 1, keys 1, secrets: Extra inputs are not permitted"),
        (rule(type=SHA1, keys=[{"id": 300, "secret": "a"}]),
         "rule 1, keys 1, id: Input should be less than or equal to 255"),
        (rule(type="none", keys=[{"id": 1, "secret": "a"}]),
         'rule 1: type "none" takes no keys and no send_key'),
        (rule(type=SHA1), "rule 1: type 'keyed-sha1' needs at least one key"),
        (rule(type=SHA1, keys=[{"id": 1, "secret": "a"}, {"id": 2, "secret": "b"}]),
         "rule 1: send_key: say which of the keys is sent"),
        (rule(type=SHA1, send_key=3, keys=[{"id": 1, "secret": "a"}]),
         "rule 1: send key 3 is not among the keys [1]"),
        (rule(type=SHA1, keys=[{"id": 1, "secret": "a"}, {"id": 1, "secret": "b"}], send_key=1),
         "rule 1: key ids repeat: [1, 1]"),
        (rule(type="md5", keys=[{"id": 1, "secret": "a"}]), "rule 1, type: Input should be"),
        (rule(type="none") + rule(type="none", peers=["10.0.0.300"]),
         "rule 2: peers: '10.0.0.300' does not appear to be an IPv4 or IPv6 network"),
        ("[[rule]\ntype = 1", "not TOML"),
        ("rules = []", "rules: Extra inputs are not permitted"),
    ],
)  # fmt: skip
def test_an_invalid_file_is_refused_naming_the_rule_and_field(text: str, message: str) -> None:
    with pytest.raises(AuthPolicyError) as caught:
        parse_policy(text)
    assert str(caught.value).startswith(message)
    for secret in (LONG_SECRET, "typo", "zz-not-hex"):
        assert secret not in str(caught.value)


def test_an_agent_with_an_invalid_file_stops_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "bfd-auth.toml"
    path.write_text(rule(type=SHA1, keys=[{"id": 1, "secret": LONG_SECRET}]))
    with pytest.raises(ConfigurationError) as caught:
        open_bfd_auth(Settings(bfd_auth_file=path))
    assert str(caught.value).startswith(f"programmer: THORN_BFD_AUTH_FILE={path}: rule 1, keys 1")
    assert LONG_SECRET not in str(caught.value)
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigurationError, match="cannot read it"):
        open_bfd_auth(Settings(bfd_auth_file=missing))
    assert open_bfd_auth(Settings(bfd_auth_file=None)) is None


def test_a_file_others_may_read_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "bfd-auth.toml"
    path.write_text(RULES)
    path.chmod(0o600)
    assert not readable_by_others(path)
    path.chmod(0o640)
    assert readable_by_others(path)


def test_the_file_is_read_again_when_it_changes_and_a_bad_edit_keeps_the_old_rules(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bfd-auth.toml"
    path.write_text(rule(type=SHA1, keys=[{"id": 1, "secret": "first"}]))
    auth = AuthFile(path)
    first = auth.policy
    assert auth.changed() is None
    # A rename over the file (as editors and Kubernetes' secret volumes do): a new inode.
    staged = tmp_path / "staged.toml"
    staged.write_text(rule(type=SHA1, keys=[{"id": 2, "secret": "second"}]))
    os.replace(staged, path)
    second = auth.changed()
    assert second is not None and second != first and auth.policy == second
    assert second.for_session("n", "10.0.0.1", None, True) == BfdAuth(
        AuthType.KEYED_SHA1, (AuthKey(2, b"second"),), 2
    )
    staged.write_text("[[rule]]\ntype = 'keyed-sha1'\n")
    os.replace(staged, path)
    with pytest.raises(AuthPolicyError, match="needs at least one key"):
        auth.changed()
    assert auth.changed() is None  # said once per change
    assert auth.policy == second


class FakeRunner:
    def __init__(self) -> None:
        self.configs: dict[int, SessionConfig] = {}
        self.auth_changes: list[tuple[int, BfdAuth | None]] = []

    def add(self, config: SessionConfig, *, ifname: str | None = None,
            netns: str | None = None) -> None:  # fmt: skip
        self.configs[config.local_discriminator] = config

    def remove(self, disc: int, *, admin_down: bool = True) -> None:
        del self.configs[disc]

    def arm(self, disc: int, messages: Any) -> None:
        pass

    def set_auth(self, disc: int, auth: BfdAuth | None) -> None:
        self.auth_changes.append((disc, auth))

    def sessions(self) -> list[Any]:
        return []


def sessions_of(runner: FakeRunner, policy: AuthPolicy) -> BfdSessions:
    return BfdSessions(
        "host1", None, runner, Discriminators(), mode="links", interval_ms=10, multiplier=3,
        report=lambda _r: None, colour_of=lambda _p: None, flip=lambda *_a: None,
        auth_policy=policy,
    )  # fmt: skip


INTENT = HostIntent("host1", 1, {}, (
    UnderlayRoute("10.224.0.0/16", "eth0", "10.0.0.0"),
    UnderlayRoute("10.240.0.0/16", "eth1", "10.0.1.0"),
), (), ())  # fmt: skip


def by_port(s: BfdSessions, runner: FakeRunner) -> dict[str | None, BfdAuth | None]:
    return {key.ifname: runner.configs[disc].auth for key, disc in s.sessions.items()}


async def test_each_session_starts_with_the_authentication_its_rule_gives() -> None:
    runner = FakeRunner()
    s = sessions_of(runner, parse_policy(RULES))
    await s.update(INTENT)
    auths = by_port(s, runner)
    assert auths["eth0"] is not None and auths["eth0"].send_key_id == 2
    assert auths["eth1"] is None


async def test_new_keys_reach_the_running_sessions_in_place() -> None:
    runner = FakeRunner()
    s = sessions_of(runner, parse_policy(RULES))
    await s.update(INTENT)
    eth0 = next(d for k, d in s.sessions.items() if k.ifname == "eth0")
    rotated = parse_policy(rule(ports=["eth0"], type="meticulous-keyed-sha1",
                                keys=[{"id": 2, "secret_hex": "00ff10"}]))  # fmt: skip
    assert await s.set_auth_policy(rotated) == 1
    new = rotated.for_session("host1", "10.0.0.0", "eth0", False)
    assert runner.auth_changes == [(eth0, new)]
    assert await s.set_auth_policy(rotated) == 0  # the same again: nothing to do
    assert await s.set_auth_policy(None) == 1
    assert runner.auth_changes[-1] == (eth0, None)
    assert set(runner.configs) == set(s.sessions.values())  # nothing was restarted
