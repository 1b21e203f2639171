"""BFD authentication end to end on an emulated fabric: the programmer serving every node of
a `leaf_spine(2, 2, 2)` lab with `THORN_BFD_AUTH_FILE` (tests/support/fabric_system.py runs
health, pathcomp and the programmer in this process on a nats-server of the test's own).

Proves the wiring from the file to the wire: every session of every node starts with the
keys its rule gives (links Meticulous, peer TEPs Keyed SHA1), all come Up with nothing
refused, the programmer's `/bfd` says how each authenticates without a secret; then a key
rotation written to the file in three steps reaches the running sessions in place: no
session goes Down and no packet is refused; no secret appears in anything the run logged.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from fabric_system import nats, nats_server, running_system

from thorn.generators import leaf_spine
from thorn_programmer import app as programmer_module

__all__ = ["nats", "nats_server"]  # the fixtures, used by name
OLD, NEW = "links-old-secret", "links-new-secret"
PEERS_SECRET_HEX = "00112233445566778899aabbccddeeff01020304"  # 20 bytes


def rules(*link_keys: tuple[int, str], send: int) -> str:
    keys = ", ".join(f'{{ id = {i}, secret = "{s}" }}' for i, s in link_keys)
    return (
        '[[rule]]\nmultihop = false\ntype = "meticulous-keyed-sha1"\n'
        f"send_key = {send}\nkeys = [{keys}]\n\n"
        '[[rule]]\nmultihop = true\ntype = "keyed-sha1"\n'
        f'keys = [{{ id = 9, secret_hex = "{PEERS_SECRET_HEX}" }}]\n'
    )


def write(path: Path, text: str) -> None:
    staged = path.with_suffix(".new")
    staged.write_text(text)
    staged.chmod(0o600)
    staged.replace(path)  # a rename, as an editor or a secret volume does


async def test_every_session_authenticates_and_a_rotation_through_the_file_flaps_none(
    make_lab: Any,
    nats: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(programmer_module, "BFD_AUTH_CHECK_SECONDS", 0.2)
    keys = tmp_path / "bfd-auth.toml"
    write(keys, rules((1, OLD), send=1))
    doc = leaf_spine(2, 2, 2)
    lab = await asyncio.to_thread(make_lab, doc)
    async with running_system(lab, doc, nats, tmp_path, bfd_auth_file=keys) as f:
        app = f.apps["programmer"][0]
        bfd = app.state.bfd
        sessions = bfd.sessions()
        links = [s for s in sessions if not s.multihop]
        peers = [s for s in sessions if s.multihop]
        assert links and peers
        assert {s.auth for s in links} == {"meticulous-keyed-sha1, sends key 1, accepts 1"}
        assert {s.auth for s in peers} == {"keyed-sha1, sends key 9, accepts 9"}
        counters = bfd.counters()
        assert not [r for r in counters.dropped if r.startswith("auth")], counters.dropped
        downs = counters.state_changes.get("down", 0)

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://programmer") as http:
            shown = (await http.get("/bfd")).text
        assert "meticulous-keyed-sha1, sends key 1" in shown
        assert OLD not in shown and PEERS_SECRET_HEX not in shown

        def links_say(auth: str) -> bool:
            return all(s.auth == auth for s in bfd.sessions() if not s.multihop)

        # The rotation: both keys accepted, then the new one sent, then the old one gone.
        steps = [
            (rules((1, OLD), (2, NEW), send=1), "sends key 1, accepts 1, 2"),
            (rules((1, OLD), (2, NEW), send=2), "sends key 2, accepts 1, 2"),
            (rules((2, NEW), send=2), "sends key 2, accepts 2"),
        ]
        for text, said in steps:
            write(keys, text)
            await f.until(lambda said=said: links_say(f"meticulous-keyed-sha1, {said}"), 10,
                          f"every link session: {said}")  # fmt: skip
            received = bfd.counters().received
            await f.until(lambda r=received: bfd.counters().received > r + 100, 10,
                          "packets under the new keys")  # fmt: skip
        counters = bfd.counters()
        assert not [r for r in counters.dropped if r.startswith("auth")], counters.dropped
        assert counters.state_changes.get("down", 0) == downs
        assert all(s.state.name == "UP" for s in bfd.sessions())
    # Every log line of the run (the services', the BFD child's): the rules, the reloads,
    # no secret.
    logged = "".join(capfd.readouterr())
    assert "bfd_auth_rules" in logged and logged.count("bfd_auth_reloaded") == 3
    for secret in (OLD, NEW, PEERS_SECRET_HEX):
        assert secret not in logged
